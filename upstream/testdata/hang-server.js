// hang-server: a minimal MCP server over stdio for fault tests of package
// upstream. It answers initialize, ping and tools/list (tools "echo" and
// "hang"), answers tools/call "echo", and never answers tools/call "hang".
// No SDK: it must behave exactly this way on any Node >= 18.
const readline = require("node:readline");

const send = (msg) => process.stdout.write(JSON.stringify(msg) + "\n");
const schema = { type: "object", properties: { message: { type: "string" } } };

readline.createInterface({ input: process.stdin }).on("line", (line) => {
  let req;
  try {
    req = JSON.parse(line);
  } catch {
    return;
  }
  if (req.id === undefined) return; // a notification
  const reply = (result) => send({ jsonrpc: "2.0", id: req.id, result });
  switch (req.method) {
    case "initialize":
      return reply({
        protocolVersion: req.params.protocolVersion,
        capabilities: { tools: {} },
        serverInfo: { name: "hang-server", version: "1.0.0" },
      });
    case "ping":
      return reply({});
    case "tools/list":
      return reply({
        tools: [
          { name: "echo", inputSchema: schema },
          { name: "hang", inputSchema: schema },
        ],
      });
    case "tools/call":
      if (req.params.name === "hang") return; // never answer
      return reply({
        content: [{ type: "text", text: String(req.params.arguments?.message) }],
      });
    default:
      return send({
        jsonrpc: "2.0",
        id: req.id,
        error: { code: -32601, message: "method not found: " + req.method },
      });
  }
});
