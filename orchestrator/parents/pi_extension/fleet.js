// fleet for a Pi *parent*: the subagent_* tools, the moderator brief, settle wake-ups.
//
// Load it with `pi -e <this file>` or let `fleet install pi` place it where Pi discovers
// extensions. Every tool runs the `fleet --json` command line (FLEET_BIN, else the absolute
// path `fleet install` baked in below, else `fleet` on PATH), so the session's supervisor starts
// on demand exactly as for any verb. While a fleet exists, the moderator brief (`fleet brief`)
// rides along as hidden context before each model call. A background watcher (`fleet wait`)
// turns settled, failed and asking children into ONE coalesced visible message that triggers a
// parent turn when Pi is idle, or waits for the current one to end: the parent never polls.
// subagent_pause, subagent_ask and subagent_stop cancel that pending wake-up for their children.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const BAKED_FLEET_BIN = null; // fleet install: the argv of the fleet that installed this file

const WATCH_TIMEOUT_S = 20;
const BRIEF_TIMEOUT_MS = 10000;
const REPORT_CLIP = 1200;

function fleetArgv() {
  if (process.env.FLEET_BIN) return [process.env.FLEET_BIN];
  if (Array.isArray(BAKED_FLEET_BIN) && BAKED_FLEET_BIN.length) return BAKED_FLEET_BIN;
  return ["fleet"];
}

const live = new Set(); // fleet processes we started and that have not exited

// Run `fleet --json VERB ARGS…`: resolves {code, json} (json: the parsed stdout, or null).
function runFleet(verb, args, { signal, timeoutMs, cwd } = {}) {
  return new Promise((resolve) => {
    const [bin, ...pre] = fleetArgv();
    const child = spawn(bin, [...pre, "--json", ...verb, ...args], {
      cwd: cwd || process.cwd(),
      stdio: ["ignore", "pipe", "pipe"],
      // A supervisor started for this parent ends a short grace after it, once it holds no
      // child (the user's own FLEET_PARENT_EXIT_S wins).
      env: { FLEET_PARENT_EXIT_S: "10", ...process.env },
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
    const kill = () => child.kill("SIGTERM");
    signal?.addEventListener("abort", kill, { once: true });
    const timer = timeoutMs ? setTimeout(kill, timeoutMs) : null;
    const done = (code) => {
      live.delete(child);
      signal?.removeEventListener("abort", kill);
      if (timer) clearTimeout(timer);
      let json = null;
      try {
        json = JSON.parse(out);
      } catch {
        json = null;
      }
      resolve({ code, json, stderr: err.trim() });
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

// A tool's CLI call: the JSON reply, or an error with the CLI's one-line message and kind.
async function fleetTool(verb, args, signal) {
  const { code, json, stderr } = await runFleet(verb, args, { signal });
  if (json && json.error) {
    const error = new Error(`${json.error.message} [${json.error.kind}]`);
    throw error;
  }
  if (json === null) {
    throw new Error(stderr.split("\n").pop() || `fleet ${verb[0]} exited ${code} without an answer`);
  }
  return json;
}

const str = (description) => ({ type: "string", description });
const strs = (description) => ({ type: "array", items: { type: "string" }, description });
const obj = (properties, required = []) => ({
  type: "object",
  properties,
  required,
  additionalProperties: false,
});
const SPAWN_FIELDS = {
  task: str("the child's whole task: goal, scope, and what its report must contain"),
  agent: str("agent definition (default scout; see subagent_agents)"),
  mode: { type: "string", enum: ["scout", "fork", "worktree"], description: "workspace mode" },
  name: str("a short unique name"),
  backend: str("backend (default: the agent's)"),
  model: str("model (default: the agent's or the session's)"),
  budget: obj(
    Object.fromEntries(
      ["soft_tokens", "hard_tokens", "soft_usd", "hard_usd"].map((k) => [
        k,
        { type: "number", minimum: 0 },
      ]),
    ),
  ),
};
SPAWN_FIELDS.budget.description = "lower the child's usage budget (never above the configured one)";

function spawnArgs(t) {
  const args = [];
  for (const key of ["agent", "mode", "name", "backend", "model"]) {
    if (t[key]) args.push(`--${key}`, String(t[key]));
  }
  const budget = Object.entries(t.budget || {}).map(([k, v]) => `${k}=${v}`);
  if (budget.length) args.push("--budget", budget.join(","));
  return args;
}

function withFile(contents, use) {
  const dir = mkdtempSync(join(tmpdir(), "fleet-pi-"));
  const path = join(dir, "request.json");
  writeFileSync(path, JSON.stringify(contents), { mode: 0o600 });
  return use(path).finally(() => rmSync(dir, { recursive: true, force: true }));
}

// name: [description, parameters, (params) => [verb, args] or async (params, signal) => reply]
const TOOLS = {
  spawn: [
    "Start children on tasks (one, or `tasks` for a batch reserved all-or-nothing). Decompose the " +
      "work first; give each child a distinct, self-contained task; never duplicate a child's " +
      "task yourself. You are woken with one message when children settle: do not poll.",
    obj({ ...SPAWN_FIELDS, tasks: { type: "array", items: obj(SPAWN_FIELDS, ["task"]) } }),
    async (p, signal) => {
      if (Array.isArray(p.tasks) && p.tasks.length) {
        return withFile(p.tasks, (path) => fleetTool(["spawn"], ["--batch", path], signal));
      }
      if (!p.task) throw new Error("subagent_spawn: give a task (or tasks)");
      return fleetTool(["spawn"], [...spawnArgs(p), "--", p.task], signal);
    },
  ],
  peek: [
    "The fleet from memory: each child's state, progress and activity. Peek before steering.",
    obj({ agents: strs("children (default: all)") }),
    (p) => [["peek"], p.agents || []],
  ],
  wait: [
    "Block until a child settles (rarely needed: settled children wake you by themselves).",
    obj({
      agents: strs("children (default: any)"),
      all: { type: "boolean", description: "wait for every named child" },
      timeout: { type: "number", description: "seconds (default 60, at most 600)" },
    }),
    (p) => [
      ["wait"],
      [
        ...(p.all ? ["--all"] : []),
        "--timeout",
        String(Math.min(Number(p.timeout) || 60, 600)),
        ...(p.agents || []),
      ],
    ],
  ],
  steer: [
    "Redirect a working child mid-turn (peek first; do not micro-manage).",
    obj({ agent: str("the child"), text: str("the correction") }, ["agent", "text"]),
    (p) => [["steer"], [p.agent, "--", p.text]],
  ],
  pause: [
    "Clear a child's queue and abort its turn; its pending wake-up is cancelled.",
    obj({ agent: str("the child") }, ["agent"]),
    (p) => [["pause"], [p.agent]],
  ],
  resume: [
    "Give an idle or paused child a new prompt.",
    obj({ agent: str("the child"), text: str("the new prompt") }, ["agent", "text"]),
    (p) => [["resume"], [p.agent, "--", p.text]],
  ],
  ask: [
    "Ask a child a side question and get its answer; its pending wake-up is cancelled.",
    obj({ agent: str("the child"), question: str("the question") }, ["agent", "question"]),
    (p) => [["ask"], [p.agent, "--", p.question]],
  ],
  answer: [
    "Answer a child's question (q<N>, or a child with one open question).",
    obj({ question: str("q<N> or the child"), text: str("the answer") }, ["question", "text"]),
    (p) => [["answer"], [p.question, "--", p.text]],
  ],
  stop: [
    "Stop children when their work is done (final) and get their handoffs.",
    obj({ agents: strs("children"), all: { type: "boolean", description: "every child" } }),
    (p) => [["stop"], [...(p.all ? ["--all"] : []), ...(p.agents || [])]],
  ],
  discard: [
    "Forget a stopped child and its unresolved state.",
    obj({ agent: str("the child") }, ["agent"]),
    (p) => [["discard"], [p.agent]],
  ],
  diff: [
    "Review the changes children copied back.",
    obj({ targets: strs("children or paths (default: everything)") }),
    (p) => [["diff"], p.targets || []],
  ],
  accept: [
    "Keep copied-back changes.",
    obj({ targets: strs("children or paths (default: everything)") }),
    (p) => [["accept"], p.targets || []],
  ],
  revert: [
    "Restore the pre-images of copied-back changes.",
    obj({ targets: strs("children or paths (default: everything)") }),
    (p) => [["revert"], ["--yes", ...(p.targets || [])]],
  ],
  discuss: [
    "The discussion paper: terse questions and answers shared with the children.",
    obj(
      {
        action: { type: "string", enum: ["ask", "answer", "list"] },
        text: str("question or answer text"),
        to: str("ask: the child it is for (default: everyone)"),
        question: str("answer: dN; list: one thread"),
        since: str("list: reread every entry after dN"),
      },
      ["action"],
    ),
    (p) => {
      if (p.action === "ask") return [["discuss", "ask"], [...(p.to ? ["--to", p.to] : []), "--", p.text || ""]];
      if (p.action === "answer") return [["discuss", "answer"], [p.question || "", "--", p.text || ""]];
      const args = [];
      if (p.since) args.push("--since", p.since);
      if (p.question) args.push("--question", p.question);
      return [["discuss", "list"], args];
    },
  ],
  vote: [
    "A democracy round on a persistent, complex decision (options: the round request object).",
    obj({
      options: { type: "object", description: "the round request (docs/coordination.md)" },
      agents: strs("idle or paused scouts to seat as voters"),
      voters: { type: "integer" },
    }, ["options"]),
    async (p, signal) =>
      withFile(p.options, (path) => {
        const args = ["--options", path];
        if (p.agents?.length) args.push("--agents", p.agents.join(","));
        if (p.voters) args.push("--voters", String(p.voters));
        return fleetTool(["vote"], args, signal);
      }),
  ],
  brief: ["What the fleet is doing and how to moderate it.", obj({}), () => [["brief"], []]],
  usage: [
    "Tokens and cost so far per child, per agent definition and for the session, with budgets.",
    obj({ agents: strs("children (default: all)") }),
    (p) => [["usage"], p.agents || []],
  ],
  agents: [
    "The agent definitions children can be spawned as.",
    obj({ scope: { type: "string", enum: ["default", "project", "both"] } }),
    (p) => [["agents"], p.scope ? ["--scope", p.scope] : []],
  ],
  mode: [
    "Show or set the workflow mode.",
    obj({ name: str("the mode to set (omit to show)") }),
    (p) => [["mode"], p.name ? [p.name] : []],
  ],
};

// Tools after which the named children's pending wake-up is dropped.
const CANCELS = new Set(["pause", "ask", "stop"]);

function noteText(note) {
  const who = note.name && note.name !== note.key ? `${note.key} (${note.name})` : note.key;
  if (note.question) {
    return `${who} asks ${note.question.id}: ${note.question.text}\n(answer with subagent_answer)`;
  }
  const head = `${who} ${note.state}`;
  const body = note.error ? `error: ${note.error}` : String(note.report || "").slice(0, REPORT_CLIP);
  return body ? `${head}:\n${body}` : head;
}

export default function fleetParent(pi) {
  const known = new Set(); // children this parent has seen and not stopped
  const pending = new Map(); // key -> notes not yet delivered
  const cancelledAt = new Map(); // key -> when a pause/ask/stop last handled it
  let busy = false;
  let watching = false;
  let brief = "";

  // A fleet exists while a child this parent has seen is neither stopped nor discarded.
  const remember = (name, reply) => {
    for (const agent of reply?.agents || []) {
      if (agent.state === "stopped") known.delete(agent.key);
      else known.add(agent.key);
    }
    for (const handoff of reply?.handoffs || []) known.delete(handoff.key);
    if (name === "discard" && reply?.key) known.delete(reply.key);
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

  const watch = async () => {
    if (watching) return;
    watching = true;
    try {
      while (true) {
        const started = Date.now();
        const { code, json } = await runFleet(["wait"], ["--timeout", String(WATCH_TIMEOUT_S)]);
        if (code === 3) continue; // nothing settled yet
        const settled = json?.settled;
        if (!Array.isArray(settled)) return; // supervisor gone, or an error
        if (settled.length === 0) return; // no child is active: nothing to wake for
        for (const note of settled) {
          if ((cancelledAt.get(note.key) ?? -1) >= started) continue;
          known.add(note.key);
          pending.set(note.key, [...(pending.get(note.key) || []), note]);
        }
        deliver();
      }
    } finally {
      watching = false;
    }
  };

  const cancel = (keys) => {
    const now = Date.now();
    for (const key of keys.filter(Boolean)) {
      cancelledAt.set(key, now);
      pending.delete(key);
    }
  };

  for (const [name, [description, parameters, plan]] of Object.entries(TOOLS)) {
    pi.registerTool({
      name: `subagent_${name}`,
      label: `subagent ${name}`,
      description,
      parameters,
      async execute(_toolCallId, params, signal) {
        const p = params || {};
        const handled = [p.agent, ...(p.agents || [])].filter(Boolean);
        if (CANCELS.has(name)) cancel(handled);
        let reply;
        const planned = plan(p, signal);
        if (Array.isArray(planned)) reply = await fleetTool(planned[0], planned[1], signal);
        else reply = await planned;
        if (CANCELS.has(name)) {
          // By key too: the parent may have named a child by its name.
          cancel([...handled, reply?.key, ...(reply?.handoffs || []).map((h) => h.key)]);
          if (name === "stop" && p.all) cancel([...known]);
        }
        remember(name, reply);
        const active = (reply?.agents || []).some(
          (a) => a.queued || ["starting", "working", "waiting"].includes(a.state),
        );
        if (name === "wait") {
          for (const note of reply?.settled || []) pending.delete(note.key);
        }
        if (["spawn", "steer", "resume", "answer"].includes(name) || active) watch();
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

  // The moderator brief as hidden context: never stored in the session, never displayed.
  pi.on("context", async (event) => {
    if (known.size === 0) return undefined;
    const { json } = await runFleet(["brief"], [], { timeoutMs: BRIEF_TIMEOUT_MS });
    if (typeof json?.text === "string") brief = json.text;
    if (!brief) return undefined;
    const hidden = {
      role: "custom",
      customType: "fleet-brief",
      content: `[fleet moderator brief]\n${brief}`,
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
