package mcptool

// What an MCP transport needs of the upstream sessions, as this adapter's
// public types, so that the transport (package mcpproxy) never imports
// package upstream or package policy (docs/design.md, "6. Packages and the
// arrows between them"; internal/archtest checks it). Each type here is a
// name for what package upstream or package policy already does: no logic
// of its own, so nothing is decided twice.

import (
	"context"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/upstream"
)

// DefaultCallTimeout bounds one request forwarded to an upstream when
// nothing else bounds it: upstream.DefaultCallTimeout (60 s), the bound of
// a tools/call whose upstream sets no call_timeout.
const DefaultCallTimeout = upstream.DefaultCallTimeout

// OnMessage handles one message an upstream sends on a direct call's own
// stream before the call's result (upstream.OnMessage, which says what msg
// and reply are).
type OnMessage = upstream.OnMessage

// Sessions gives the live client session of an upstream by its name, for
// the requests a transport passes through (resources, prompts,
// completions, logging, subscriptions). *upstream.Manager implements it:
// its Session fails with upstream.ErrUnknownUpstream, upstream.ErrDown or
// upstream.ErrClosed, and the session may die at any moment (see there).
// Do not close the session.
type Sessions interface {
	Session(name string) (*mcp.ClientSession, error)
}

var _ Sessions = (*upstream.Manager)(nil)

// SessionsOrNil is s, or nil when s holds a nil *upstream.Manager (a
// gateway that fronts no upstream passes one): a nil check on the result
// then means "no upstreams", as a nil check on the *upstream.Manager did.
func SessionsOrNil(s Sessions) Sessions {
	if m, ok := s.(*upstream.Manager); ok && m == nil {
		return nil
	}
	return s
}

// ClientHandlers are the client-side handlers through which what upstreams
// send to their client (sampling, elicitation, roots, progress, logging,
// resource and prompt notifications) reaches the gateway's clients, and the
// capabilities declared to upstreams for them. Each field is the one of
// upstream.Options of the same name, with the same meaning; name in each
// handler is the upstream's name. A transport fills it (mcpproxy's
// RelayUpstream); the gateway's wiring installs it (Install). The zero
// value installs nothing.
type ClientHandlers struct {
	// ClientCapabilities are declared to every upstream
	// (upstream.Options.ClientCapabilities); nil leaves the Options' own.
	ClientCapabilities *mcp.ClientCapabilities

	// CreateMessage answers an upstream's sampling/createMessage request.
	CreateMessage func(ctx context.Context, name string, req *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error)
	// Elicit answers an upstream's elicitation/create request.
	Elicit func(ctx context.Context, name string, req *mcp.ElicitRequest) (*mcp.ElicitResult, error)
	// ListRoots answers an upstream's roots/list request.
	ListRoots func(ctx context.Context, name string, req *mcp.ListRootsRequest) (*mcp.ListRootsResult, error)

	// Progress receives notifications/progress.
	Progress func(ctx context.Context, name string, req *mcp.ProgressNotificationClientRequest)
	// LoggingMessage receives notifications/message.
	LoggingMessage func(ctx context.Context, name string, req *mcp.LoggingMessageRequest)
	// ResourceUpdated receives notifications/resources/updated.
	ResourceUpdated func(ctx context.Context, name string, req *mcp.ResourceUpdatedNotificationRequest)
	// ResourceListChanged receives notifications/resources/list_changed.
	ResourceListChanged func(ctx context.Context, name string, req *mcp.ResourceListChangedRequest)
	// PromptListChanged receives notifications/prompts/list_changed.
	PromptListChanged func(ctx context.Context, name string, req *mcp.PromptListChangedRequest)
	// ElicitationComplete receives notifications/elicitation/complete.
	ElicitationComplete func(ctx context.Context, name string, req *mcp.ElicitationCompleteNotificationRequest)
}

// Install puts h into o: each handler h sets replaces the one o had (a nil
// handler of h leaves o's as it was), and h.ClientCapabilities is used only
// when o declares none, so capabilities the gateway's wiring chose are
// kept. Call it before upstream.New(cfgs, o); the Manager reads o once.
func (h *ClientHandlers) Install(o *upstream.Options) {
	if o.ClientCapabilities == nil {
		o.ClientCapabilities = h.ClientCapabilities
	}
	if h.CreateMessage != nil {
		o.CreateMessage = h.CreateMessage
	}
	if h.Elicit != nil {
		o.Elicit = h.Elicit
	}
	if h.ListRoots != nil {
		o.ListRoots = h.ListRoots
	}
	if h.Progress != nil {
		o.Progress = h.Progress
	}
	if h.LoggingMessage != nil {
		o.LoggingMessage = h.LoggingMessage
	}
	if h.ResourceUpdated != nil {
		o.ResourceUpdated = h.ResourceUpdated
	}
	if h.ResourceListChanged != nil {
		o.ResourceListChanged = h.ResourceListChanged
	}
	if h.PromptListChanged != nil {
		o.PromptListChanged = h.PromptListChanged
	}
	if h.ElicitationComplete != nil {
		o.ElicitationComplete = h.ElicitationComplete
	}
}
