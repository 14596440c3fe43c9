// record-server: a minimal MCP server over stdio for the gateway's crash
// tests. Every tools/call it receives is appended (and fsynced) as one line
// of JSON {"name","arguments"} to the file named by its first argument,
// before it answers: the file lists what the gateway really forwarded.
// Tools: "echo" answers with arguments.message; "hang" never answers.
// No SDK: it must behave exactly this way on any Node >= 18.
const fs = require("node:fs");
const readline = require("node:readline");

const log = fs.openSync(process.argv[2], "a");
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
        serverInfo: { name: "record-server", version: "1.0.0" },
      });
    case "ping":
      return reply({});
    case "tools/list":
      return reply({
        tools: [
          { name: "echo", inputSchema: schema, annotations: { readOnlyHint: true } },
          { name: "hang", inputSchema: schema, annotations: { readOnlyHint: true } },
        ],
      });
    case "tools/call":
      fs.writeSync(log, JSON.stringify({ name: req.params.name, arguments: req.params.arguments ?? {} }) + "\n");
      fs.fsyncSync(log);
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
