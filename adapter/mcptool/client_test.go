package mcptool_test

import (
	"context"
	"reflect"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/adapter/mcptool"
	"github.com/toolgate/toolgate/upstream"
)

// TestClientHandlersMatchOptions pins that ClientHandlers has exactly the
// client-side handlers of upstream.Options (every func field taking a
// context, an upstream name and an *mcp request) and ClientCapabilities,
// each with the type of the Options field of the same name: a handler
// added to upstream.Options and not here would never be installed.
func TestClientHandlersMatchOptions(t *testing.T) {
	ctxType := reflect.TypeFor[context.Context]()
	isHandler := func(f reflect.StructField) bool {
		ft := f.Type
		return ft.Kind() == reflect.Func && ft.NumIn() == 3 && ft.In(0) == ctxType && ft.In(1).Kind() == reflect.String &&
			ft.In(2).Kind() == reflect.Pointer && ft.In(2).Elem().PkgPath() == reflect.TypeFor[mcp.ElicitRequest]().PkgPath()
	}
	opts := reflect.TypeFor[upstream.Options]()
	var want []string
	for f := range opts.Fields() {
		if isHandler(f) || f.Name == "ClientCapabilities" {
			want = append(want, f.Name)
		}
	}
	hs := reflect.TypeFor[mcptool.ClientHandlers]()
	var got []string
	for f := range hs.Fields() {
		got = append(got, f.Name)
		of, ok := opts.FieldByName(f.Name)
		if !ok {
			t.Errorf("ClientHandlers.%s: upstream.Options has no such field", f.Name)
			continue
		}
		if of.Type != f.Type {
			t.Errorf("ClientHandlers.%s is %v; upstream.Options.%s is %v", f.Name, f.Type, f.Name, of.Type)
		}
	}
	slices.Sort(want)
	slices.Sort(got)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ClientHandlers fields (-want +got):\n%s", diff)
	}
}

// TestClientHandlersInstall checks which handlers and capabilities Install
// leaves in the Options: every handler it sets replaces the Options' own,
// a nil one keeps it, and capabilities the Options already declare stay.
func TestClientHandlersInstall(t *testing.T) {
	ctx := context.Background()
	ownCaps := &mcp.ClientCapabilities{Sampling: &mcp.SamplingCapabilities{}}
	relayCaps := &mcp.ClientCapabilities{Elicitation: &mcp.ElicitationCapabilities{}}
	// calls runs every handler of o and says whose each one was.
	calls := func(o *upstream.Options) {
		if o.CreateMessage != nil {
			o.CreateMessage(ctx, "up", nil)
		}
		if o.Elicit != nil {
			o.Elicit(ctx, "up", nil)
		}
		if o.ListRoots != nil {
			o.ListRoots(ctx, "up", nil)
		}
		if o.Progress != nil {
			o.Progress(ctx, "up", nil)
		}
		if o.LoggingMessage != nil {
			o.LoggingMessage(ctx, "up", nil)
		}
		if o.ResourceUpdated != nil {
			o.ResourceUpdated(ctx, "up", nil)
		}
		if o.ResourceListChanged != nil {
			o.ResourceListChanged(ctx, "up", nil)
		}
		if o.PromptListChanged != nil {
			o.PromptListChanged(ctx, "up", nil)
		}
		if o.ElicitationComplete != nil {
			o.ElicitationComplete(ctx, "up", nil)
		}
	}
	var who []string
	mark := func(s string) { who = append(who, s) }
	relay := mcptool.ClientHandlers{
		ClientCapabilities: relayCaps,
		CreateMessage: func(context.Context, string, *mcp.CreateMessageWithToolsRequest) (*mcp.CreateMessageWithToolsResult, error) {
			mark("relay:CreateMessage")
			return nil, nil
		},
		Elicit: func(context.Context, string, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
			mark("relay:Elicit")
			return nil, nil
		},
		ListRoots: func(context.Context, string, *mcp.ListRootsRequest) (*mcp.ListRootsResult, error) {
			mark("relay:ListRoots")
			return nil, nil
		},
		Progress:            func(context.Context, string, *mcp.ProgressNotificationClientRequest) { mark("relay:Progress") },
		LoggingMessage:      func(context.Context, string, *mcp.LoggingMessageRequest) { mark("relay:LoggingMessage") },
		ResourceUpdated:     func(context.Context, string, *mcp.ResourceUpdatedNotificationRequest) { mark("relay:ResourceUpdated") },
		ResourceListChanged: func(context.Context, string, *mcp.ResourceListChangedRequest) { mark("relay:ResourceListChanged") },
		PromptListChanged:   func(context.Context, string, *mcp.PromptListChangedRequest) { mark("relay:PromptListChanged") },
		ElicitationComplete: func(context.Context, string, *mcp.ElicitationCompleteNotificationRequest) {
			mark("relay:ElicitationComplete")
		},
	}
	all := []string{"relay:CreateMessage", "relay:Elicit", "relay:ListRoots", "relay:Progress", "relay:LoggingMessage",
		"relay:ResourceUpdated", "relay:ResourceListChanged", "relay:PromptListChanged", "relay:ElicitationComplete"}
	onlyElicit := mcptool.ClientHandlers{Elicit: relay.Elicit}
	tests := []struct {
		name     string
		h        mcptool.ClientHandlers
		opts     func() *upstream.Options
		wantCall []string
		wantCaps *mcp.ClientCapabilities
	}{
		{
			name:     "empty options get every handler and the capabilities",
			h:        relay,
			opts:     func() *upstream.Options { return &upstream.Options{} },
			wantCall: all,
			wantCaps: relayCaps,
		},
		{
			name:     "capabilities the options declare are kept",
			h:        relay,
			opts:     func() *upstream.Options { return &upstream.Options{ClientCapabilities: ownCaps} },
			wantCall: all,
			wantCaps: ownCaps,
		},
		{
			name: "handlers set replace the options' own, nil ones keep them",
			h:    onlyElicit,
			opts: func() *upstream.Options {
				return &upstream.Options{
					Elicit: func(context.Context, string, *mcp.ElicitRequest) (*mcp.ElicitResult, error) {
						mark("own:Elicit")
						return nil, nil
					},
					Progress: func(context.Context, string, *mcp.ProgressNotificationClientRequest) { mark("own:Progress") },
				}
			},
			wantCall: []string{"relay:Elicit", "own:Progress"},
		},
		{
			name:     "the zero value installs nothing",
			opts:     func() *upstream.Options { return &upstream.Options{ClientCapabilities: ownCaps} },
			wantCaps: ownCaps,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			who = nil
			o := tc.opts()
			tc.h.Install(o)
			calls(o)
			if diff := cmp.Diff(tc.wantCall, who); diff != "" {
				t.Errorf("handlers run (-want +got):\n%s", diff)
			}
			if o.ClientCapabilities != tc.wantCaps {
				t.Errorf("ClientCapabilities = %p, want %p", o.ClientCapabilities, tc.wantCaps)
			}
		})
	}
}

// TestSessionsOrNil checks that a nil *upstream.Manager, which is a
// non-nil Sessions, becomes a nil Sessions, and that a live one stays.
func TestSessionsOrNil(t *testing.T) {
	var none *upstream.Manager
	if got := mcptool.SessionsOrNil(none); got != nil {
		t.Errorf("SessionsOrNil(nil *upstream.Manager) = %#v, want nil", got)
	}
	if got := mcptool.SessionsOrNil(nil); got != nil {
		t.Errorf("SessionsOrNil(nil) = %#v, want nil", got)
	}
	m, err := upstream.New(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if got := mcptool.SessionsOrNil(m); got != mcptool.Sessions(m) {
		t.Errorf("SessionsOrNil(m) = %#v, want m", got)
	}
}
