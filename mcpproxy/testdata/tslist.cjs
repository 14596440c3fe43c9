// tslist.cjs URL KEY: connects to the gateway at URL with the TypeScript
// MCP SDK client (@modelcontextprotocol/sdk, from testdata/npm: run with
// NODE_PATH set to its node_modules), lists tools, resources, resource
// templates and prompts (following nextCursor), and prints
// {"tools":[names],"resources":[uris],"resourceTemplates":[...],"prompts":[...]}
// as one JSON line. Any error (the SDK's schema validation refuses a list
// that is null) exits 1 with the error on stderr.
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

async function all(list, member, key) {
  const out = [];
  let cursor;
  do {
    const res = await list(cursor ? { cursor } : {});
    for (const x of res[member]) out.push(x[key]);
    cursor = res.nextCursor;
  } while (cursor);
  return out;
}

(async () => {
  const [url, key] = process.argv.slice(2);
  const client = new Client({ name: "tslist", version: "1.0.0" });
  const transport = new StreamableHTTPClientTransport(new URL(url), {
    requestInit: { headers: { Authorization: "Bearer " + key } },
  });
  await client.connect(transport);
  const out = {
    tools: await all((p) => client.listTools(p), "tools", "name"),
    resources: await all((p) => client.listResources(p), "resources", "uri"),
    resourceTemplates: await all((p) => client.listResourceTemplates(p), "resourceTemplates", "uriTemplate"),
    prompts: await all((p) => client.listPrompts(p), "prompts", "name"),
  };
  process.stdout.write(JSON.stringify(out) + "\n");
  await client.close();
})().catch((err) => {
  process.stderr.write(String(err && err.stack ? err.stack : err) + "\n");
  process.exit(1);
});
