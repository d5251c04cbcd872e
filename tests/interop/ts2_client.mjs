// A small MCP client of ours on the TypeScript SDK v2 (@modelcontextprotocol/client, pinned by
// tests/interop/package-lock.json), driven by pytest over JSON lines (tests/interop/test_ts2_client.py).
//
// Usage:
//   node ts2_client.mjs NEGOTIATION http URL
//   node ts2_client.mjs NEGOTIATION stdio COMMAND [ARG...]
// NEGOTIATION is how the client picks its protocol era, as ClientOptions.versionNegotiation takes it:
// `auto` (probe with server/discover, fall back to initialize), `pin` (exactly 2026-07-28, no
// fallback) or `legacy` (the plain 2025 initialize handshake). MCP_INTEROP_NODE_MODULES names the
// node_modules folder that holds the SDK (scripts/setup-interop.sh installs it outside the repository).
//
// Contract:
// - Connects as a real client does (connect, then listTools at once: v2 caches the listing and from
//   then on validates every callTool result's structuredContent against the tool's outputSchema, and
//   throws when it does not match). Prints one line:
//   {"ok": true, "connected": {"serverVersion", "protocolVersion", "era", "tools": [names]}}, or
//   {"ok": false, "error": {...}} and exits 1 when the connection fails.
// - Then reads one JSON command per stdin line and prints exactly one JSON line per command, in order:
//     {"op": "listTools"} | {"op": "listResources"} | {"op": "listPrompts"}
//     {"op": "readResource", "uri": U} | {"op": "getPrompt", "name": N, "arguments": {...}}
//     {"op": "setLoggingLevel", "level": L}
//     {"op": "callTool", "name": N, "arguments": {...}, "progress": bool, "timeoutMs": n,
//      "logLevel": L (2026: the per-request log level in _meta), "id": ID (start it and answer at once
//      {"ok": true, "started": ID}; "abort"/"await" then act on it)}
//     {"op": "abort", "id": ID}  (AbortSignal.abort() on a started call)
//     {"op": "await", "id": ID}  (the started call's outcome, as callTool would print it)
//     {"op": "listen", "filter": {...}}  (subscriptions/listen: open, print the honored filter, close)
//     {"op": "notifications"}  (the logging notifications seen so far, then forgotten)
//   -> {"ok": true, "result": <what the SDK returned>, "progress": [notifications seen]}
//   -> {"ok": false, "error": {"name", "message", "code", "data"}} when the SDK threw: that is the
//      failure a user of this SDK sees instead of a result.
// - With MCP_INTEROP_ELICIT_REPLY=TEXT it declares elicitation and accepts every elicitation with
//   {"answer": TEXT} (2025: a server-to-client request; 2026: input_required, fulfilled by the SDK).
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
const pkg = (rel) => import(pathToFileURL(join(modules, "@modelcontextprotocol/client/dist", rel)).href);
const sdk = await pkg("index.mjs");
const { Client, StreamableHTTPClientTransport } = sdk;

const MAX_TEXT = 100_000; // bound what we echo back: a runaway result must not flood pytest's pipe
const NEGOTIATION = {
  auto: { mode: "auto" },
  pin: { mode: { pin: "2026-07-28" } },
  legacy: { mode: "legacy" },
};

function emit(obj) {
  let line = JSON.stringify(obj);
  if (line.length > MAX_TEXT) {
    line = JSON.stringify({ ok: false, error: { name: "Truncated", message: line.slice(0, 2000) } });
  }
  process.stdout.write(line + "\n");
}

function describe(err) {
  let data = err?.data ?? null;
  try {
    JSON.stringify(data);
  } catch {
    data = String(data);
  }
  return {
    name: err?.name ?? typeof err,
    message: String(err?.message ?? err).slice(0, 4000),
    code: err?.code ?? null,
    data,
  };
}

async function makeTransport(kind, rest) {
  if (kind === "http") {
    return new StreamableHTTPClientTransport(new URL(rest[0]));
  }
  if (kind === "stdio") {
    const { StdioClientTransport } = await pkg("stdio.mjs");
    // The server's stderr is inherited: pytest captures it with ours.
    return new StdioClientTransport({ command: rest[0], args: rest.slice(1), env: process.env, stderr: "inherit" });
  }
  throw new Error(`unknown transport ${kind}`);
}

const [negotiation, kind, ...rest] = process.argv.slice(2);
if (!(negotiation in NEGOTIATION)) {
  process.stderr.write(`unknown negotiation ${negotiation}\n`);
  process.exit(2);
}
const elicitReply = process.env.MCP_INTEROP_ELICIT_REPLY;
const client = new Client(
  { name: "mcp-recovery-proxy-interop-ts2", version: "1.0.0" },
  {
    capabilities: elicitReply ? { elicitation: {} } : {},
    versionNegotiation: NEGOTIATION[negotiation],
  },
);
if (elicitReply) {
  client.setRequestHandler("elicitation/create", async () => ({ action: "accept", content: { answer: elicitReply } }));
}
const logs = [];
client.setNotificationHandler("notifications/message", (n) => {
  logs.push(n.params);
});

try {
  await client.connect(await makeTransport(kind, rest));
  const tools = await client.listTools();
  emit({
    ok: true,
    connected: {
      serverVersion: client.getServerVersion() ?? null,
      protocolVersion: client.getNegotiatedProtocolVersion() ?? null,
      era: client.getProtocolEra() ?? null,
      tools: tools.tools.map((t) => t.name),
    },
  });
} catch (err) {
  emit({ ok: false, error: describe(err) });
  process.exit(1);
}

const started = new Map(); // id -> {controller, outcome: Promise}

async function callTool(cmd, signal) {
  const progress = [];
  const options = {};
  if (cmd.timeoutMs) options.timeout = cmd.timeoutMs;
  if (signal) options.signal = signal;
  if (cmd.progress) options.onprogress = (p) => progress.push(p);
  const params = { name: cmd.name, arguments: cmd.arguments ?? {} };
  if (cmd.logLevel) params._meta = { [sdk.LOG_LEVEL_META_KEY]: cmd.logLevel };
  const result = await client.callTool(params, options);
  return { ok: true, result, progress };
}

async function settle(promise) {
  try {
    return await promise;
  } catch (err) {
    return { ok: false, error: describe(err) };
  }
}

async function run(cmd) {
  switch (cmd.op) {
    case "listTools":
      return { ok: true, result: await client.listTools() };
    case "listResources":
      return { ok: true, result: await client.listResources() };
    case "listPrompts":
      return { ok: true, result: await client.listPrompts() };
    case "readResource":
      return { ok: true, result: await client.readResource({ uri: cmd.uri }) };
    case "getPrompt":
      return { ok: true, result: await client.getPrompt({ name: cmd.name, arguments: cmd.arguments ?? {} }) };
    case "setLoggingLevel":
      return { ok: true, result: await client.setLoggingLevel(cmd.level) };
    case "callTool": {
      if (cmd.id === undefined) return await callTool(cmd);
      const controller = new AbortController();
      started.set(cmd.id, { controller, outcome: settle(callTool(cmd, controller.signal)) });
      return { ok: true, started: cmd.id };
    }
    case "abort":
      started.get(cmd.id).controller.abort(new Error("aborted by the test"));
      return { ok: true };
    case "await": {
      const outcome = await started.get(cmd.id).outcome;
      started.delete(cmd.id);
      return outcome;
    }
    case "listen": {
      const sub = await client.listen(cmd.filter ?? {});
      const honored = sub.honoredFilter;
      await sub.close();
      return { ok: true, result: { honoredFilter: honored, closed: await sub.closed } };
    }
    case "notifications":
      return { ok: true, result: logs.splice(0) };
    default:
      throw new Error(`unknown op ${cmd.op}`);
  }
}

const lines = createInterface({ input: process.stdin, crlfDelay: Infinity });
for await (const line of lines) {
  if (!line.trim()) continue;
  emit(await settle(run(JSON.parse(line))));
}
await client.close();
process.exit(0);
