// An MCP server of ours on the TypeScript SDK (McpServer + StreamableHTTPServerTransport, the SDK's
// stateful-session pattern), the HTTP upstream of the interop matrix.
//
// Usage: node ts_http_server.mjs PORT   (MCP_INTEROP_NODE_MODULES names the SDK's node_modules)
//
// Contract:
// - Listens on 127.0.0.1:PORT, path /mcp, and prints "listening PORT" on stdout once it accepts.
// - Sessions live in this process only: after a restart, a request carrying an old session id is
//   answered as the SDK's own example answers it, HTTP 400 "Bad Request: No valid session ID
//   provided" (the proxy must re-attach, not call it a validation error).
// - Tools:
//     echo {text}                       read-only; returns the text
//     forecast {city}                   read-only; declares an outputSchema {city, temperature};
//                                       an unknown city is an isError result without
//                                       structuredContent: "City not found: <city>"
//     whoami {}                         read-only; returns this process's pid (tells a restarted
//                                       server from the one before)
import { createServer } from "node:http";
import { randomUUID } from "node:crypto";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.MCP_INTEROP_NODE_MODULES;
if (!modules) {
  process.stderr.write("MCP_INTEROP_NODE_MODULES is not set\n");
  process.exit(2);
}
const load = (rel) => import(pathToFileURL(join(modules, rel)).href);
const { McpServer } = await load("@modelcontextprotocol/sdk/dist/esm/server/mcp.js");
const { StreamableHTTPServerTransport } = await load("@modelcontextprotocol/sdk/dist/esm/server/streamableHttp.js");
const { isInitializeRequest } = await load("@modelcontextprotocol/sdk/dist/esm/types.js");
const { z } = await load("zod/index.js");

const port = Number(process.argv[2]);
if (!Number.isInteger(port) || port <= 0) {
  process.stderr.write("usage: ts_http_server.mjs PORT\n");
  process.exit(2);
}

const TEMPERATURES = { Paris: 18, Oslo: 4, Lima: 22 };
const readOnly = { readOnlyHint: true, idempotentHint: true, destructiveHint: false, openWorldHint: false };

function newServer() {
  const server = new McpServer({ name: "interop-ts-http-server", version: "1.0.0" });
  server.registerTool(
    "echo",
    { description: "Echo the text back", inputSchema: { text: z.string() }, annotations: readOnly },
    async ({ text }) => ({ content: [{ type: "text", text }] }),
  );
  server.registerTool(
    "forecast",
    {
      description: "Today's temperature in a known city",
      inputSchema: { city: z.string() },
      outputSchema: { city: z.string(), temperature: z.number() },
      annotations: readOnly,
    },
    async ({ city }) => {
      if (!(city in TEMPERATURES)) {
        return { isError: true, content: [{ type: "text", text: `City not found: ${city.slice(0, 100)}` }] };
      }
      const out = { city, temperature: TEMPERATURES[city] };
      return { content: [{ type: "text", text: JSON.stringify(out) }], structuredContent: out };
    },
  );
  server.registerTool(
    "whoami",
    { description: "This server process's pid", inputSchema: {}, annotations: readOnly },
    async () => ({ content: [{ type: "text", text: String(process.pid) }] }),
  );
  return server;
}

const transports = new Map(); // session id -> transport
const MAX_BODY = 1 << 20;

async function readJson(req) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size > MAX_BODY) throw new Error("body too large");
    chunks.push(chunk);
  }
  return chunks.length ? JSON.parse(Buffer.concat(chunks).toString("utf8")) : undefined;
}

function badRequest(res, message) {
  res.writeHead(400, { "content-type": "application/json" });
  res.end(JSON.stringify({ jsonrpc: "2.0", error: { code: -32000, message }, id: null }));
}

const http = createServer(async (req, res) => {
  try {
    if (new URL(req.url, "http://127.0.0.1").pathname !== "/mcp") {
      res.writeHead(404).end();
      return;
    }
    const sessionId = req.headers["mcp-session-id"];
    const body = req.method === "POST" ? await readJson(req) : undefined;
    let transport = sessionId ? transports.get(sessionId) : undefined;
    if (!transport) {
      if (sessionId || req.method !== "POST" || !isInitializeRequest(body)) {
        // The SDK example's answer for a session this process does not know.
        badRequest(res, "Bad Request: No valid session ID provided");
        return;
      }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => transports.set(id, transport),
      });
      transport.onclose = () => {
        if (transport.sessionId) transports.delete(transport.sessionId);
      };
      await newServer().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  } catch (err) {
    if (!res.headersSent) badRequest(res, `Bad Request: ${String(err?.message ?? err).slice(0, 200)}`);
    else res.end();
  }
});

http.listen(port, "127.0.0.1", () => {
  process.stdout.write(`listening ${port}\n`);
});
for (const signal of ["SIGTERM", "SIGINT"]) {
  process.on(signal, () => {
    http.close();
    process.exit(0);
  });
}
