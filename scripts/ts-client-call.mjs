// One tools/call as a TypeScript SDK client makes it: listTools first (the SDK then checks every
// result's structuredContent against the tool's output schema, errors included), then callTool.
//
//   NODE_PATH=DIR/node_modules node scripts/ts-client-call.mjs URL TOOL '{"arg": 1}'
//
// DIR holds `npm install @modelcontextprotocol/sdk@1.32.2`. Prints one JSON line: {"ok": true,
// "result": ...} when callTool returned (an isError result included), {"ok": false, "error": ...}
// when the SDK threw; exits 0 or 1 accordingly. Used to show that a tool error from a tool with an
// output schema is readable through the proxy (issue 12 item 1).
import { createRequire } from "node:module";
import path from "node:path";

const require = createRequire(path.join(process.env.NODE_PATH ?? process.cwd(), "noop.js"));
const { Client } = require("@modelcontextprotocol/sdk/client/index.js");
const { StreamableHTTPClientTransport } = require("@modelcontextprotocol/sdk/client/streamableHttp.js");

const [url, tool, rawArgs] = process.argv.slice(2);
const client = new Client({ name: "ts-client-call", version: "0.0.1" });
const timer = setTimeout(() => {
  console.log(JSON.stringify({ ok: false, error: "timed out after 30 s" }));
  process.exit(1);
}, 30_000);
let code = 0;
try {
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  await client.listTools();
  const result = await client.callTool({ name: tool, arguments: JSON.parse(rawArgs ?? "{}") });
  console.log(JSON.stringify({ ok: true, result }));
} catch (error) {
  console.log(JSON.stringify({ ok: false, error: String(error?.message ?? error) }));
  code = 1;
} finally {
  clearTimeout(timer);
  await client.close().catch(() => {});
}
process.exit(code);
