package mcptool

import (
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate"
	"github.com/toolgate/toolgate/authz"
	"github.com/toolgate/toolgate/policy"
	"github.com/toolgate/toolgate/toolid"
)

// AnnouncedTool is an upstream's tool as it joins the catalog (authz's
// type, here so that enforcement points need not import the core).
type AnnouncedTool = authz.AnnouncedTool

// Announced maps an upstream's tool list to catalog entries: each name is
// mapped to tool:<upstream>-<mapped name>; names that cannot be mapped, and
// names that map to the same id, are refused and reported, never merged.
func Announced(u *policy.Upstream, tools []*mcp.Tool) (ok []AnnouncedTool, problems []string) {
	byID := map[string][]string{}
	for _, t := range tools {
		mapped, err := toolid.Map(t.Name)
		if err != nil || strings.HasPrefix(t.Name, toolid.Prefix) {
			problems = append(problems, fmt.Sprintf("upstream %s announced tool %q, whose name cannot be mapped to a tool id (%v); it is refused", u.Name, t.Name, err))
			continue
		}
		id := toolid.Prefix + u.Name + "-" + strings.TrimPrefix(mapped, toolid.Prefix)
		if !toolid.Valid(id) {
			problems = append(problems, fmt.Sprintf("upstream %s announced tool %q, which maps to an invalid id %q; it is refused", u.Name, t.Name, id))
			continue
		}
		byID[id] = append(byID[id], t.Name)
	}
	for _, t := range tools {
		mapped, err := toolid.Map(t.Name)
		if err != nil || strings.HasPrefix(t.Name, toolid.Prefix) {
			continue
		}
		id := toolid.Prefix + u.Name + "-" + strings.TrimPrefix(mapped, toolid.Prefix)
		names := byID[id]
		if len(names) > 1 {
			if names[0] == t.Name {
				problems = append(problems, fmt.Sprintf("upstream %s announced %q, which all map to %s; they are refused, not merged", u.Name, names, id))
			}
			continue
		}
		if !toolid.Valid(id) {
			continue
		}
		ok = append(ok, AnnouncedTool{ID: id, Name: u.Prefix() + t.Name, MCPServer: u.Name,
			SideEffectClass: classFromAnnotations(t.Annotations), Description: t.Description})
	}
	return ok, problems
}

// classFromAnnotations is the class an upstream's annotations claim:
// destructiveHint → irreversible (also with readOnlyHint: contradictory
// claims read as the worse one), readOnlyHint → read, otherwise write
// (unknown means careful). A claim only ever raises a tool's class: the
// catalog (authz.Compile) never lets it lower the class the bundle gives,
// and without a Tool document an announced tool is at least write.
func classFromAnnotations(a *mcp.ToolAnnotations) toolgate.SideEffectClass {
	switch {
	case a == nil:
		return toolgate.SideEffectWrite
	case a.DestructiveHint != nil && *a.DestructiveHint:
		return toolgate.SideEffectIrreversible
	case a.ReadOnlyHint:
		return toolgate.SideEffectRead
	}
	return toolgate.SideEffectWrite
}
