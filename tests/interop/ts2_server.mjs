// An MCP server of ours on the TypeScript SDK v2 (@modelcontextprotocol/server 2.4.0, HTTP through
// @modelcontextprotocol/node 2.1.2), wired the way the v2 README and type docs tell a team to
// deploy it: one McpServer factory, served over stdio by `serveStdio(factory)` and over HTTP by
// `toNodeHandler(createMcpHandler(factory))` on plain node:http with the localhost Host/Origin
// guards. Both entries serve the 2026-07-28 revision and, by default, the 2025 handshake too (HTTP:
// stateless per-request serving of 2025 traffic, GET/DELETE answered 405).
//
// Usage: node ts2_server.mjs --stdio JOURNAL
//        node ts2_server.mjs --http PORT JOURNAL   (prints "listening PORT" once it accepts)
// MCP_INTEROP_NODE_MODULES names the node_modules holding the SDK.
//
// Contract (what tests/interop/test_ts2_server.py relies on):
// - JOURNAL is a JSON-lines file; every tool execution appends {"event", "tool", "pid", ...}
//   synchronously before the tool answers, so a test counts attempts and cancels exactly.
// - Tools:
//     echo {text}                    read-only; returns the text
//     flaky {key, failures}          idempotent; the first `failures` executions for `key` (counted
//                                    in a state file beside the journal, so a restarted server keeps
//                                    counting) answer an isError result whose structuredContent says
//                                    errorCategory "transient"; later ones succeed
//     charge {key, fail, hold_ms}    no annotations (state-changing by the spec's defaults): waits
//                                    hold_ms, then charges; fail=true answers a transient isError
//                                    after charging (the outcome a caller cannot know)
//     hang {key, seconds}            read-only; waits `seconds` (default 600) or until the request is
//                                    cancelled, journalling "cancelled" with the request id
//     slow {key, seconds}            the same, under another name (the tests give it a long
//                                    attempt timeout, so only a caller's cancel can stop it)
//     forecast {city}                read-only; outputSchema {city, temperature}, structuredContent;
//                                    an unknown city is an isError result without structuredContent
//     progress {steps}               read-only; sends `steps` progress notifications and an info log
//                                    message per step, then answers "done <steps>"
// - Resource `note://readme` (text) and prompt `greet {name}`.
import { createServer } from "node:http";
import { appendFileSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.MCP_INTEROP_NODE_MODULES;
if (!modules) {
  process.stderr.write("MCP_INTEROP_NODE_MODULES is not set\n");
  process.exit(2);
}
const load = (rel) => import(pathToFileURL(join(modules, rel)).href);
const { McpServer, createMcpHandler } = await load("@modelcontextprotocol/server/dist/index.mjs");
const { serveStdio } = await load("@modelcontextprotocol/server/dist/stdio.mjs");
const { toNodeHandler, localhostHostValidation, localhostOriginValidation } = await load(
  "@modelcontextprotocol/node/dist/index.mjs",
);
const { z } = await load("zod/index.js");

const [mode, ...rest] = process.argv.slice(2);
const port = mode === "--http" ? Number(rest.shift()) : 0;
const journal = rest[0];
if (!journal || (mode !== "--stdio" && mode !== "--http") || (mode === "--http" && !(port > 0))) {
  process.stderr.write("usage: ts2_server.mjs --stdio JOURNAL | --http PORT JOURNAL\n");
  process.exit(2);
}
const countsFile = `${journal}.counts.json`;

function record(event, tool, extra = {}) {
  appendFileSync(journal, JSON.stringify({ event, tool, pid: process.pid, ...extra }) + "\n");
}

function bump(key) {
  let counts = {};
  try {
    counts = JSON.parse(readFileSync(countsFile, "utf8"));
  } catch {
    // first execution: no counts yet
  }
  counts[key] = (counts[key] ?? 0) + 1;
  writeFileSync(countsFile, JSON.stringify(counts));
  return counts[key];
}

const sleep = (ms, signal) =>
  new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal?.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    });
  });

const readOnly = { readOnlyHint: true, idempotentHint: true, destructiveHint: false, openWorldHint: false };
const idempotent = { readOnlyHint: false, idempotentHint: true, destructiveHint: false, openWorldHint: false };
const TEMPERATURES = { Paris: 18, Oslo: 4, Lima: 22 };
const transient = (text) => ({
  isError: true,
  content: [{ type: "text", text }],
  structuredContent: { errorCategory: "transient", isRetryable: true },
});

function newServer() {
  const server = new McpServer(
    { name: "interop-ts2-server", version: "1.0.0" },
    { capabilities: { logging: {} } },
  );
  server.registerTool(
    "echo",
    { description: "Echo the text back", inputSchema: z.object({ text: z.string() }), annotations: readOnly },
    async ({ text }) => {
      record("executed", "echo");
      return { content: [{ type: "text", text }] };
    },
  );
  server.registerTool(
    "flaky",
    {
      description: "Fails `failures` times per key, then succeeds",
      inputSchema: z.object({ key: z.string(), failures: z.number().int().min(0) }),
      annotations: idempotent,
    },
    async ({ key, failures }) => {
      const n = bump(`flaky:${key}`);
      record("executed", "flaky", { key, n });
      if (n <= failures) return transient(`flaky: backend unavailable (execution ${n} of ${failures} failing)`);
      return { content: [{ type: "text", text: `flaky ok after ${n} executions` }] };
    },
  );
  server.registerTool(
    "charge",
    {
      description: "Charge a card (state-changing)",
      inputSchema: z.object({ key: z.string(), fail: z.boolean().optional(), hold_ms: z.number().optional() }),
    },
    async ({ key, fail, hold_ms }, ctx) => {
      record("started", "charge", { key });
      if (hold_ms) await sleep(hold_ms, ctx.mcpReq.signal);
      record("executed", "charge", { key });
      if (fail) return transient("charge: payment gateway timed out after charging");
      return { content: [{ type: "text", text: `charged ${key}` }] };
    },
  );
  for (const name of ["hang", "slow"]) {
    server.registerTool(
      name,
      {
        description: "Waits until cancelled (or `seconds`)",
        inputSchema: z.object({ key: z.string(), seconds: z.number().optional() }),
        annotations: readOnly,
      },
      async ({ key, seconds }, ctx) => {
        const signal = ctx.mcpReq.signal;
        record("started", name, { key, id: ctx.mcpReq.id });
        signal.addEventListener("abort", () => record("cancelled", name, { key, id: ctx.mcpReq.id }));
        await sleep((seconds ?? 600) * 1000, signal);
        if (!signal.aborted) record("executed", name, { key });
        return { content: [{ type: "text", text: `${name} ${key} done` }] };
      },
    );
  }
  server.registerTool(
    "forecast",
    {
      description: "Today's temperature in a known city",
      inputSchema: z.object({ city: z.string() }),
      outputSchema: z.object({ city: z.string(), temperature: z.number() }),
      annotations: readOnly,
    },
    async ({ city }) => {
      record("executed", "forecast");
      if (!(city in TEMPERATURES)) {
        return { isError: true, content: [{ type: "text", text: `City not found: ${city.slice(0, 100)}` }] };
      }
      const out = { city, temperature: TEMPERATURES[city] };
      return { content: [{ type: "text", text: JSON.stringify(out) }], structuredContent: out };
    },
  );
  server.registerTool(
    "progress",
    {
      description: "Reports progress and logs each step",
      inputSchema: z.object({ steps: z.number().int().min(1).max(20) }),
      annotations: readOnly,
    },
    async ({ steps }, ctx) => {
      const token = ctx.mcpReq._meta?.progressToken;
      for (let i = 1; i <= steps; i++) {
        await ctx.mcpReq.log("info", `step ${i} of ${steps}`, "ts2-server");
        if (token !== undefined) {
          await ctx.mcpReq.notify({
            method: "notifications/progress",
            params: { progressToken: token, progress: i, total: steps, message: `step ${i}` },
          });
        }
      }
      record("executed", "progress", { token: token ?? null });
      return { content: [{ type: "text", text: `done ${steps}` }] };
    },
  );
  server.registerResource("readme", "note://readme", { title: "Readme", mimeType: "text/plain" }, async (uri) => ({
    contents: [{ uri: uri.href, mimeType: "text/plain", text: "ts2 server readme" }],
  }));
  server.registerPrompt(
    "greet",
    { description: "Greet someone", argsSchema: z.object({ name: z.string() }) },
    ({ name }) => ({ messages: [{ role: "user", content: { type: "text", text: `Hello, ${name}!` } }] }),
  );
  return server;
}

if (mode === "--stdio") {
  serveStdio(() => newServer());
} else {
  const handler = toNodeHandler(createMcpHandler(() => newServer()));
  const validateHost = localhostHostValidation();
  const validateOrigin = localhostOriginValidation();
  const http = createServer(async (req, res) => {
    if (!validateHost(req, res) || !validateOrigin(req, res)) return;
    if (!req.url?.startsWith("/mcp")) {
      res.writeHead(404).end();
      return;
    }
    await handler(req, res);
  });
  http.listen(port, "127.0.0.1", () => process.stdout.write(`listening ${port}\n`));
  const stop = () => http.close(() => process.exit(0));
  process.on("SIGTERM", stop);
  process.on("SIGINT", stop);
}
