package adapter

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/toolgate/toolgate/builtin"
)

// markerReserve is the room kept for the closing marker of a cut result.
const markerReserve = 160

// ReadFactor is how many times the result cap an upstream's answer may be,
// as sent, for the gateway to read it (and then cut it to the cap with
// CapResult): room for the JSON encoding (escapes), structuredContent (up
// to twice the cap) and _meta. A larger answer is not read at all: it is
// refused while it arrives (upstream.Options.MaxResultBytes) and the call
// gets an isError result saying it was too large.
const ReadFactor = 16

// ReadLimit is the most the gateway reads of one upstream answer, in bytes,
// for a result cap of maxBytes (Settings.result_max_kib × 1024; 0 or less
// means builtin.DefaultResultMaxKiB): ReadFactor × the cap, 1 MiB for the
// default cap of 64 KiB.
func ReadLimit(maxBytes int) int {
	if maxBytes <= 0 {
		maxBytes = builtin.DefaultResultMaxKiB * 1024
	}
	return ReadFactor * maxBytes
}

// CapResult bounds a tool result to maxBytes (Settings.result_max_kib × 1024)
// and says whether it cut anything. It never modifies res: a cut result is
// a copy.
//
// What is bounded is what the model reads: the content items together, a
// text item counting its text's bytes and any other item (image, audio,
// resource) its JSON encoding. Items are kept in order while they fit; the
// text item that crosses the bound is cut at a line or UTF-8 boundary and
// marked "[truncated: N of M bytes shown]" (builtin.Cap); later items are
// dropped, and a last text item says how many and how large. The
// structuredContent, which carries the same data as the content, may take up
// to twice maxBytes (its JSON encoding is larger than the text); beyond
// that it is dropped and the marker says so. A cut is never silent.
func CapResult(res *mcp.CallToolResult, maxBytes int) (*mcp.CallToolResult, bool) {
	if res == nil || maxBytes <= 0 {
		return res, false
	}
	sizes := make([]int, len(res.Content))
	total := 0
	for i, c := range res.Content {
		sizes[i] = contentSize(c)
		total += sizes[i]
	}
	structSize := 0
	if res.StructuredContent != nil {
		if b, err := json.Marshal(res.StructuredContent); err == nil {
			structSize = len(b)
		}
	}
	dropStruct := structSize > 2*maxBytes
	if total <= maxBytes && !dropStruct {
		return res, false
	}
	out := *res
	out.Content = make([]mcp.Content, 0, len(res.Content)+1)
	var notes []string
	if total > maxBytes {
		budget := max(maxBytes-markerReserve, 0)
		dropped, droppedBytes := 0, 0
		for i, c := range res.Content {
			switch {
			case sizes[i] <= budget:
				out.Content = append(out.Content, c)
				budget -= sizes[i]
			case isText(c) && budget > 0:
				tc := *c.(*mcp.TextContent)
				tc.Text, _ = builtin.Cap(tc.Text, budget)
				out.Content = append(out.Content, &tc)
				budget = 0
			default:
				dropped++
				droppedBytes += sizes[i]
				budget = 0 // keep the order: nothing after a dropped item
			}
		}
		if dropped > 0 {
			notes = append(notes, fmt.Sprintf("%d more content items (%d bytes) dropped", dropped, droppedBytes))
		}
	}
	if dropStruct {
		out.StructuredContent = nil
		notes = append(notes, fmt.Sprintf("structuredContent (%d bytes) dropped", structSize))
	}
	if len(notes) > 0 || total > maxBytes {
		msg := fmt.Sprintf("[truncated: the result is capped at %d bytes (result_max_kib)", maxBytes)
		if len(notes) > 0 {
			msg += "; " + strings.Join(notes, "; ")
		}
		out.Content = append(out.Content, &mcp.TextContent{Text: msg + "]"})
	}
	return &out, true
}

func isText(c mcp.Content) bool {
	_, ok := c.(*mcp.TextContent)
	return ok
}

// contentSize is a text item's text length, or any other item's JSON size.
func contentSize(c mcp.Content) int {
	if tc, ok := c.(*mcp.TextContent); ok {
		return len(tc.Text)
	}
	b, err := json.Marshal(c)
	if err != nil {
		return 0
	}
	return len(b)
}

// TextResult is a result with one text item: the shape of a built-in tool's
// result and of every failure message the gateway writes itself.
func TextResult(text string, structured any, isError bool) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}, StructuredContent: structured, IsError: isError}
}
