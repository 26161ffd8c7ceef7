// fleet for a Pi *parent*: fleet's ten parent tools, the moderator brief, settle wake-ups.
//
// Load it with `pi -e <this file>` or let `fleet install pi` place it where Pi discovers
// extensions. The tools are `fleet mcp`'s, read from `fleet tool --list` when Pi loads this
// file (one source: the same names, descriptions and JSON schemas), registered as fleet_<name>;
// each call runs `fleet tool NAME -` (FLEET_BIN, else the absolute path `fleet install` baked in
// below, else `fleet` on PATH), which checks the arguments against the schema before anything
// runs and prints the same framed result the MCP server gives; an error reaches the model as
// its one-line message and kind. The session's supervisor starts on demand as for any verb.
//
// While a fleet exists, the moderator brief rides along as hidden context before each model
// call. One background watcher (`fleet tool wait`) is the only reader of settle notes: it
// keeps them until the parent's fleet_wait takes them, or, when Pi is idle, turns them into ONE
// coalesced visible message that triggers a parent turn: the parent never has to poll.
// fleet_control pause/ask and fleet_stop cancel that pending wake-up for their children.
import { execFileSync, spawn } from "node:child_process";

const BAKED_FLEET_BIN = null; // fleet install: the argv of the fleet that installed this file

const PREFIX = "fleet_";
const WATCH_TIMEOUT_S = 20;
const WAIT_DEFAULT_S = 50; // fleet mcp's: below the minute a parent gives one tool call
const BRIEF_TIMEOUT_MS = 10000;
const LIST_TIMEOUT_MS = 30000;
const NOTE_CLIP = 1200;

function fleetArgv() {
  if (process.env.FLEET_BIN) return [process.env.FLEET_BIN];
  if (Array.isArray(BAKED_FLEET_BIN) && BAKED_FLEET_BIN.length) return BAKED_FLEET_BIN;
  return ["fleet"];
}

// A supervisor started for this parent ends a short grace after it, once it holds no child
// (the user's own FLEET_PARENT_EXIT_S wins).
const fleetEnv = () => ({ FLEET_PARENT_EXIT_S: "10", ...process.env });

const live = new Set(); // fleet processes we started and that have not exited

// Run `fleet ARGV…` with *input* on its stdin: resolves {code, out, err}.
function runFleet(argv, { input = "", signal, timeoutMs } = {}) {
  return new Promise((resolve) => {
    const [bin, ...pre] = fleetArgv();
    const child = spawn(bin, [...pre, ...argv], {
      cwd: process.cwd(),
      stdio: ["pipe", "pipe", "pipe"],
      env: fleetEnv(),
    });
    live.add(child);
    let out = "";
    let err = "";
    child.stdout.setEncoding("utf8");
    child.stderr.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      out += chunk;
    });
    child.stderr.on("data", (chunk) => {
      if (err.length < 4000) err += chunk;
    });
    child.stdin.on("error", () => {}); // a fleet that exited before reading its arguments
    child.stdin.end(input);
    const kill = () => child.kill("SIGTERM");
    signal?.addEventListener("abort", kill, { once: true });
    const timer = timeoutMs ? setTimeout(kill, timeoutMs) : null;
    let ended = false;
    const done = (code) => {
      if (ended) return;
      ended = true;
      live.delete(child);
      signal?.removeEventListener("abort", kill);
      if (timer) clearTimeout(timer);
      resolve({ code, out, err: err.trim() });
    };
    child.on("error", (error) => {
      err = `${bin}: ${error.message}`;
      done(127);
    });
    child.on("close", (code) => done(code ?? 1));
  });
}

process.on("exit", () => {
  for (const child of live) child.kill("SIGTERM");
});

function parsed(text) {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}

// One tool call through `fleet tool`: its result, or an Error whose message is fleet's
// `{"error": {"kind", "message"}}` (what an MCP parent's model reads too).
async function callTool(name, args, signal, timeoutMs) {
  const { code, out, err } = await runFleet(["tool", name, "-"], {
    input: JSON.stringify(args ?? {}),
    signal,
    timeoutMs,
  });
  const json = parsed(out);
  if (json && json.error) throw new Error(JSON.stringify(json));
  if (json === null) {
    const message = err.split("\n").pop() || `fleet tool ${name} exited ${code} without an answer`;
    throw new Error(JSON.stringify({ error: { kind: "unreachable", message } }));
  }
  return json;
}

// fleet's tools and instructions, as `fleet mcp` lists them.
function listTools() {
  const [bin, ...pre] = fleetArgv();
  const out = execFileSync(bin, [...pre, "tool", "--list"], {
    encoding: "utf8",
    env: fleetEnv(),
    timeout: LIST_TIMEOUT_MS,
    stdio: ["ignore", "pipe", "pipe"],
  });
  return JSON.parse(out);
}

// `peek`, `control` steer… in the brief, as the tools this parent has.
function named(text, names) {
  return text.replace(/`([a-z]+)`/g, (whole, word) => (names.has(word) ? `\`${PREFIX}${word}\`` : whole));
}

function noteText(note) {
  const who = note.name && note.name !== note.key ? `${note.key} (${note.name})` : note.key;
  if (note.question) {
    return `${who} asks ${note.question.id}: ${note.question.text}\n(answer with ${PREFIX}control answer)`;
  }
  const head = `${who} ${note.state}`;
  const body = note.error ? `error: ${note.error}` : String(note.report || "").slice(0, NOTE_CLIP);
  return body ? `${head}:\n${body}` : head;
}

export default function fleetParent(pi) {
  const listed = listTools();
  const names = new Set(listed.tools.map((t) => t.name));
  const known = new Set(); // children this parent has seen and not stopped
  const pending = new Map(); // key -> notes the watcher read, not yet taken or delivered
  const cancelledAt = new Map(); // key -> when a pause/ask/stop last handled it
  const wakers = new Set(); // fleet_wait calls blocked on the watcher
  const changed = () => {
    for (const wake of wakers) wake();
    wakers.clear();
  };
  let progress = { questions: [], working: [] }; // the watcher's last look
  let busy = false;
  let watching = false;
  let brief = "";

  // A fleet exists while a child this parent has seen is neither stopped nor discarded.
  const remember = (reply) => {
    for (const agent of reply?.agents || []) {
      if (agent.state === "stopped") known.delete(agent.key);
      else known.add(agent.key);
    }
    for (const handoff of reply?.handoffs || []) known.delete(handoff.key);
  };

  const deliver = () => {
    if (busy || pending.size === 0) return;
    const notes = [...pending.values()].flat();
    pending.clear();
    const count = notes.length === 1 ? "1 child" : `${notes.length} children`;
    const text = `[fleet] ${count} settled or asked:\n\n${notes.map(noteText).join("\n\n")}`;
    pi.sendMessage(
      { customType: "fleet-settled", content: text, display: true, details: { notes } },
      { triggerTurn: true, deliverAs: "followUp" },
    );
  };

  // The one reader of settle notes while a child is active.
  const watch = async () => {
    if (watching) return;
    watching = true;
    try {
      while (true) {
        const started = Date.now();
        let reply;
        try {
          reply = await callTool("wait", { timeout: WATCH_TIMEOUT_S });
        } catch {
          return; // supervisor gone, or an error
        }
        if (!reply.timed_out && (reply.settled || []).length === 0) return; // no child is active
        keep(reply, started);
        deliver();
      }
    } finally {
      watching = false;
      changed();
    }
  };

  // What a wait read: its notes (unless a pause/ask/stop handled the child since) and its look
  // at the working children.
  const keep = (reply, started) => {
    progress = { questions: reply.questions || [], working: reply.working || [] };
    for (const note of reply.settled || []) {
      if ((cancelledAt.get(note.key) ?? -1) >= started) continue;
      known.add(note.key);
      pending.set(note.key, [...(pending.get(note.key) || []), note]);
    }
    changed();
  };

  const cancel = (keys) => {
    const now = Date.now();
    for (const key of keys.filter(Boolean)) {
      cancelledAt.set(key, now);
      pending.delete(key);
    }
  };

  // fleet_wait: the notes the watcher read for these children (any, or each with `all`),
  // else, at the timeout, a normal result with what is still working (as fleet mcp's).
  const waitTool = async (p, signal) => {
    // fleet checks the arguments (and the children named) and hands out what is ready now.
    const started = Date.now();
    keep(await callTool("wait", { ...p, timeout: 0 }, signal), started);
    const wanted = (p.agents || []).filter(Boolean);
    const deadline = Date.now() + 1000 * (p.timeout ?? WAIT_DEFAULT_S);
    watch();
    while (true) {
      const keys = [...pending.keys()].filter(
        (key) => !wanted.length || wanted.some((w) => w === key || pending.get(key).some((n) => n.name === w)),
      );
      const enough = p.all && wanted.length ? keys.length >= wanted.length : keys.length > 0;
      if (enough) {
        const settled = keys.flatMap((key) => pending.get(key));
        for (const key of keys) pending.delete(key);
        return { timed_out: false, ...progress, settled };
      }
      const left = deadline - Date.now();
      if (left <= 0 || signal?.aborted || !watching) {
        return { timed_out: true, ...progress, settled: [] };
      }
      await new Promise((resolve) => {
        const wake = () => {
          clearTimeout(timer);
          resolve();
        };
        const timer = setTimeout(() => {
          wakers.delete(wake);
          resolve();
        }, Math.min(left, 1000));
        wakers.add(wake);
      });
    }
  };

  for (const tool of listed.tools) {
    pi.registerTool({
      name: `${PREFIX}${tool.name}`,
      label: `fleet ${tool.name}`,
      description: tool.description,
      parameters: tool.inputSchema,
      async execute(_toolCallId, params, signal) {
        const p = params || {};
        const handled = [p.agent, ...(p.agents || [])].filter(Boolean);
        const cancels =
          tool.name === "stop" || (tool.name === "control" && ["pause", "ask"].includes(p.action));
        if (cancels) cancel(handled);
        const reply = tool.name === "wait" ? await waitTool(p, signal) : await callTool(tool.name, p, signal);
        if (cancels) {
          // By key too: the parent may have named a child by its name.
          cancel([...handled, reply?.key, ...(reply?.handoffs || []).map((h) => h.key)]);
          if (tool.name === "stop" && handled.includes("*")) cancel([...known]);
        }
        remember(reply);
        if (tool.name !== "wait" && !["peek", "report", "info", "review", "paper"].includes(tool.name)) watch();
        else if ((reply?.agents || []).some((a) => a.queued || ["starting", "working", "waiting"].includes(a.state))) watch();
        return { content: [{ type: "text", text: JSON.stringify(reply) }], details: reply };
      },
    });
  }

  pi.on("agent_start", async () => {
    busy = true;
  });
  pi.on("agent_end", async () => {
    busy = false;
    setTimeout(deliver, 0);
  });

  // The instructions and the moderator brief as hidden context: never stored in the session,
  // never displayed.
  pi.on("context", async (event) => {
    if (known.size === 0) return undefined;
    const { out } = await runFleet(["tool", "info", "-"], {
      input: JSON.stringify({ topic: "brief" }),
      timeoutMs: BRIEF_TIMEOUT_MS,
    });
    const text = parsed(out)?.text;
    if (typeof text === "string") brief = named(text, names);
    if (!brief) return undefined;
    const hidden = {
      role: "custom",
      customType: "fleet-brief",
      content: `[fleet moderator brief]\n${listed.instructions}\n${brief}`,
      display: false,
      timestamp: Date.now(),
    };
    // Just before the latest prompt or wake-up, so that stays the last word the model reads.
    const messages = [...event.messages];
    let at = messages.length;
    while (at > 0 && !["user", "custom"].includes(messages[at - 1].role)) at -= 1;
    messages.splice(at > 0 ? at - 1 : messages.length, 0, hidden);
    return { messages };
  });
}
