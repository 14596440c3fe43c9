// busy-server: a minimal MCP server over stdio for the health-check tests
// of package upstream. It answers initialize, ping and tools/list, and
// tools/call of two tools that each take {ms} and answer "done" after ms
// milliseconds, answering no ping meanwhile (the answers are sent at the
// end, as a server whose output is queued behind a large result would):
//
//   - busy: sends a notifications/message every 20 ms meanwhile, so the
//     gateway keeps receiving bytes (busy, not gone);
//   - mute: sends nothing meanwhile (hung).
//
// No SDK: it must behave exactly this way on any Node >= 18.
const readline = require("node:readline");

const send = (msg) => process.stdout.write(JSON.stringify(msg) + "\n");
const schema = { type: "object", properties: { ms: { type: "number" } } };
let held = null; // ids of pings held back while a call runs

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  if (req.id === undefined) return; // a notification
  const reply = (id, result) => send({ jsonrpc: "2.0", id, result });
  switch (req.method) {
    case "initialize":
      return reply(req.id, {
        protocolVersion: req.params.protocolVersion,
        capabilities: { tools: {}, logging: {} },
        serverInfo: { name: "busy-server", version: "1.0.0" },
      });
    case "ping":
      if (held) return held.push(req.id);
      return reply(req.id, {});
    case "tools/list":
      return reply(req.id, {
        tools: [
          { name: "busy", inputSchema: schema },
          { name: "mute", inputSchema: schema },
        ],
      });
    case "tools/call": {
      const ms = Number(req.params.arguments?.ms) || 1000;
      held = held || [];
      const tick =
        req.params.name === "busy"
          ? setInterval(
              () =>
                send({
                  jsonrpc: "2.0",
                  method: "notifications/message",
                  params: { level: "info", data: "still working" },
                }),
              20,
            )
          : null;
      setTimeout(() => {
        if (tick) clearInterval(tick);
        for (const id of held) reply(id, {});
        held = null;
        reply(req.id, { content: [{ type: "text", text: "done" }] });
      }, ms);
      return;
    }
    default:
      return send({
        jsonrpc: "2.0",
        id: req.id,
        error: { code: -32601, message: "method not found: " + req.method },
      });
  }
});
