// fleet's own tools (ask_parent, todo, discuss, subagent) for a Pi child.
//
// Pi has no MCP client, so this extension registers the tools itself and relays each call to
// the fleet child runtime over the same 0600 Unix socket our MCP server uses (child/_mcp.py:
// one JSON line each way, with the per-child token). The fleet Pi backend loads it with
// `--extension` and passes FLEET_MCP_SOCKET, FLEET_MCP_TOKEN and FLEET_MCP_TOOLS (the tools'
// JSON schemas, which Pi validates as plain JSON Schema) in Pi's environment, never on argv.
import net from "node:net";

function relay(tool, args, signal) {
  return new Promise((resolve, reject) => {
    const socket = net.createConnection(process.env.FLEET_MCP_SOCKET);
    let data = "";
    const abort = () => socket.destroy(new Error(`${tool}: aborted`));
    signal?.addEventListener("abort", abort, { once: true });
    socket.setEncoding("utf8");
    socket.on("connect", () => {
      const request = { token: process.env.FLEET_MCP_TOKEN, tool, args };
      socket.write(`${JSON.stringify(request)}\n`);
    });
    socket.on("data", (chunk) => {
      data += chunk;
    });
    socket.on("end", () => {
      signal?.removeEventListener("abort", abort);
      try {
        resolve(JSON.parse(data.split("\n")[0]));
      } catch {
        resolve({ text: `${tool}: the fleet child runtime gave no answer`, is_error: true });
      }
    });
    socket.on("error", (error) => {
      signal?.removeEventListener("abort", abort);
      reject(error);
    });
  });
}

export default function fleetTools(pi) {
  const tools = JSON.parse(process.env.FLEET_MCP_TOOLS || "[]");
  for (const tool of tools) {
    pi.registerTool({
      name: tool.name,
      label: tool.name,
      description: tool.description,
      parameters: tool.inputSchema,
      async execute(toolCallId, params, signal) {
        const reply = await relay(tool.name, params, signal);
        if (reply.is_error) {
          throw new Error(reply.text); // Pi turns a thrown error into an error tool result
        }
        return { content: [{ type: "text", text: String(reply.text) }], details: {} };
      },
    });
  }
}
