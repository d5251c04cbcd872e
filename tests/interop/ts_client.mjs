// A small MCP client of ours on the TypeScript SDK (@modelcontextprotocol/sdk, pinned by
// tests/interop/package-lock.json), driven by pytest over JSON lines.
//
// Usage:
//   node ts_client.mjs http URL
//   node ts_client.mjs stdio COMMAND [ARG...]
// with MCP_INTEROP_NODE_MODULES naming the node_modules folder that holds the SDK
// (scripts/setup-interop.sh installs it outside the repository).
//
// Contract:
// - Connects as a real client does (initialize, then listTools at once: that caches each tool's
//   outputSchema, and from then on the SDK checks every callTool result's structuredContent
//   against it, isError results included, and throws when it does not match). Prints one line:
//   {"ok": true, "connected": {"serverVersion", "protocolVersion", "tools": [names]}}, or
//   {"ok": false, "error": {...}} and exits 1 when the connection fails.
// - Then reads one JSON command per stdin line and prints exactly one JSON line per command, in
//   order:
//     {"op": "listTools"}
//     {"op": "callTool", "name": N, "arguments": {...}, "progress": bool, "timeoutMs": n}
//     {"op": "readResource", "uri": U}   {"op": "getPrompt", "name": N, "arguments": {...}}
//   -> {"ok": true, "result": <what the SDK returned>, "progress": [notifications seen],
//       "logs": [params of notifications/message received while the command ran]}
//   -> {"ok": false, "error": {"name", "message", "code", "data"}} when the SDK threw: that is
//      the failure a user of this SDK sees instead of a result.
// - With MCP_INTEROP_SAMPLING_REPLY=NAME it declares sampling and answers every sampling request
//   with the text "NAME answers <the first message's text>" (a client that tells its answers
//   apart from another client's).
// - Closes the client when stdin ends, and exits 0.
import { createInterface } from "node:readline";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.MCP_INTEROP_NODE_MODULES;
if (!modules) {
  process.stderr.write("MCP_INTEROP_NODE_MODULES is not set\n");
  process.exit(2);
}
// ESM resolution ignores NODE_PATH, so the pinned SDK is imported by its file (its esm build).
const sdk = (rel) => import(pathToFileURL(join(modules, "@modelcontextprotocol/sdk/dist/esm", rel)).href);
const { Client } = await sdk("client/index.js");

const MAX_TEXT = 100_000; // bound what we echo back: a runaway result must not flood pytest's pipe

function emit(obj) {
  let line = JSON.stringify(obj);
  if (line.length > MAX_TEXT) {
    line = JSON.stringify({ ok: false, error: { name: "Truncated", message: line.slice(0, 2000) } });
  }
  process.stdout.write(line + "\n");
}

function describe(err) {
  return {
    name: err?.name ?? typeof err,
    message: String(err?.message ?? err).slice(0, 4000),
    code: err?.code ?? null,
    data: err?.data ?? null,
  };
}

async function makeTransport(kind, rest) {
  if (kind === "http") {
    const { StreamableHTTPClientTransport } = await sdk("client/streamableHttp.js");
    return new StreamableHTTPClientTransport(new URL(rest[0]));
  }
  if (kind === "stdio") {
    const { StdioClientTransport } = await sdk("client/stdio.js");
    // The server's stderr is inherited: pytest captures it with ours.
    return new StdioClientTransport({ command: rest[0], args: rest.slice(1), env: process.env, stderr: "inherit" });
  }
  throw new Error(`unknown transport ${kind}`);
}

const [kind, ...rest] = process.argv.slice(2);
const samplingReply = process.env.MCP_INTEROP_SAMPLING_REPLY;
const client = new Client(
  { name: "mcp-recovery-proxy-interop-ts", version: "1.0.0" },
  { capabilities: samplingReply ? { sampling: {} } : {} },
);
if (samplingReply) {
  const { CreateMessageRequestSchema } = await sdk("types.js");
  client.setRequestHandler(CreateMessageRequestSchema, async (request) => {
    const asked = request.params.messages[0]?.content?.text ?? "";
    return { role: "assistant", content: { type: "text", text: `${samplingReply} answers ${asked}` }, model: "m" };
  });
}
let logs = [];
{
  const { LoggingMessageNotificationSchema } = await sdk("types.js");
  client.setNotificationHandler(LoggingMessageNotificationSchema, (n) => logs.push(n.params));
}
try {
  await client.connect(await makeTransport(kind, rest));
  const tools = await client.listTools();
  emit({
    ok: true,
    connected: {
      serverVersion: client.getServerVersion() ?? null,
      protocolVersion: client.transport?.protocolVersion ?? null,
      tools: tools.tools.map((t) => t.name),
    },
  });
} catch (err) {
  emit({ ok: false, error: describe(err) });
  process.exit(1);
}

async function run(cmd) {
  if (cmd.op === "listTools") {
    return { ok: true, result: await client.listTools() };
  }
  if (cmd.op === "callTool") {
    const progress = [];
    const options = {};
    if (cmd.timeoutMs) options.timeout = cmd.timeoutMs;
    if (cmd.progress) {
      options.onprogress = (p) => progress.push(p);
      if (cmd.timeoutMs) options.resetTimeoutOnProgress = false;
    }
    logs = [];
    const result = await client.callTool({ name: cmd.name, arguments: cmd.arguments ?? {} }, undefined, options);
    return { ok: true, result, progress, logs };
  }
  if (cmd.op === "readResource") {
    return { ok: true, result: await client.readResource({ uri: cmd.uri }) };
  }
  if (cmd.op === "getPrompt") {
    return { ok: true, result: await client.getPrompt({ name: cmd.name, arguments: cmd.arguments ?? {} }) };
  }
  throw new Error(`unknown op ${cmd.op}`);
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line.trim()) continue;
  try {
    emit(await run(JSON.parse(line)));
  } catch (err) {
    emit({ ok: false, error: describe(err) });
  }
}
await client.close();
process.exit(0);
