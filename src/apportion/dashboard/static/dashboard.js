// apportion dashboard: draws the scheduler's status as it streams in (/events).
//
// Theory of operation: every `status` message holds the whole current picture except
// the task stream and the warnings, which arrive as increments (only new items).  The
// page keeps those two, bounded, and re-renders each section from the latest message.
// Sections update the DOM nodes they made before (kept in Maps by id) instead of
// rebuilding, so 200 workers stay cheap.  Every string from the scheduler is user
// data (keys, names, commands): it is only ever set with textContent, never innerHTML.
// Times are the scheduler's clock: always compared with the message's `now`.

const STREAM_KEEP = 20000; // executions kept for the task stream
const EVENTS_KEEP = 500; // warnings kept
const COMPACT_WORKERS = 16; // more workers than this: one line per worker

const state = {
  status: null, // the last message
  receivedAt: 0, // performance.now() when it came: to advance `now` between messages
  schedulerId: null,
  streamSeq: 0,
  eventsSeq: 0,
  stream: [], // [seq, worker, thread, key, group, start, stop, ok, resources]
  events: [], // [seq, time, level, text], oldest first
};

// ---------------------------------------------------------------- small helpers

const $ = (id) => document.getElementById(id);

/** An element with a class and text; the only way data reaches the DOM. */
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined && text !== null) node.textContent = String(text);
  return node;
}

/** Set textContent only when it changed: keeps selections and avoids layout work. */
function setText(node, text) {
  const value = String(text);
  if (node.textContent !== value) node.textContent = value;
}

function setAttr(node, name, value) {
  const v = String(value);
  if (node.getAttribute(name) !== v) node.setAttribute(name, v);
}

/**
 * Make `container`'s children match `items`, in order: one node per id, kept in
 * `nodes` (a Map) across calls; `make(item)` builds a node once, `update(node, item)`
 * refreshes it every time.
 */
function keyed(container, nodes, items, idOf, make, update) {
  const seen = new Set();
  let cursor = container.firstChild;
  for (const item of items) {
    const id = idOf(item);
    seen.add(id);
    let node = nodes.get(id);
    if (!node) {
      node = make(item);
      nodes.set(id, node);
    }
    update(node, item);
    if (node !== cursor) container.insertBefore(node, cursor);
    else cursor = cursor.nextSibling;
  }
  for (const [id, node] of nodes) {
    if (!seen.has(id)) {
      node.remove();
      nodes.delete(id);
    }
  }
}

const UNITS = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
function bytes(n) {
  if (n === null || n === undefined) return "";
  let i = 0;
  let v = Number(n);
  while (Math.abs(v) >= 1024 && i < UNITS.length - 1) {
    v /= 1024;
    i += 1;
  }
  return `${i === 0 ? v : v.toFixed(v < 10 ? 1 : 0)} ${UNITS[i]}`;
}

/** An amount of a pool: bytes for byte pools, else a short number (0.5 of a GPU). */
function amount(n, isBytes) {
  if (isBytes) return bytes(n);
  return Number.isInteger(n) ? String(n) : String(Math.round(n * 100) / 100);
}

function ago(seconds) {
  const s = Math.max(0, seconds);
  if (s < 1) return "now";
  if (s < 90) return `${Math.round(s)} s ago`;
  if (s < 5400) return `${Math.round(s / 60)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

function duration(s) {
  if (s < 0.001) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1000).toFixed(1)} ms`;
  if (s < 120) return `${s.toFixed(2)} s`;
  return `${(s / 60).toFixed(1)} min`;
}

/** The scheduler's clock now, advanced by the browser's since the last message. */
function schedulerNow() {
  if (!state.status) return 0;
  return state.status.now + (performance.now() - state.receivedAt) / 1000;
}

/** A stable colour per task group, from a hash of its name. */
const colours = new Map();
function colourOf(group) {
  let c = colours.get(group);
  if (!c) {
    let h = 2166136261;
    for (let i = 0; i < group.length; i++) h = Math.imul(h ^ group.charCodeAt(i), 16777619);
    h >>>= 0;
    // Hues 25..335 only: reds are kept for failures.
    c = `hsl(${25 + (h % 310)} ${50 + (h >> 9) % 30}% ${48 + (h >> 17) % 16}%)`;
    colours.set(group, c);
  }
  return c;
}

/** A clickable task key: opens its story. */
function keyLink(key) {
  const a = el("span", "key", key);
  a.dataset.key = key;
  a.title = `story of ${key}`;
  return a;
}

/** A bar of used / total with its text inside. */
function makeBar() {
  const bar = el("div", "bar");
  bar.append(el("div", "fill"), el("span", "text"));
  return bar;
}
function updateBar(bar, used, total, text, title) {
  const frac = total > 0 ? Math.min(1, used / total) : 0;
  const fill = bar.firstChild;
  fill.style.width = `${(frac * 100).toFixed(1)}%`;
  fill.className = frac >= 0.999 ? "fill full" : frac >= 0.8 ? "fill hot" : "fill";
  setText(bar.lastChild, text);
  setAttr(bar, "title", title || text);
  setAttr(bar, "data-used", used);
  setAttr(bar, "data-total", total);
}

// ---------------------------------------------------------------- header

function renderHeader(s) {
  setText($("scheduler-address"), s.scheduler.address || s.scheduler.id || "");
  const n = s.workers.length;
  setText($("cluster-size"), `${n} worker${n === 1 ? "" : "s"} · ${s.threads} threads · ${s.clients} client${s.clients === 1 ? "" : "s"}`);
  const chips = Object.entries(s.tasks).filter(([, count]) => count > 0);
  keyed($("task-counts"), nodesOf("taskchips"), chips, ([name]) => name,
    ([name]) => el("span", `chip ${name}`),
    (node, [name, count]) => setText(node, `${name} ${count}`));
}

const nodeMaps = new Map();
function nodesOf(name) {
  let m = nodeMaps.get(name);
  if (!m) nodeMaps.set(name, (m = new Map()));
  return m;
}

// ---------------------------------------------------------------- resources

function poolTitle(pool, holders) {
  const base = `${pool.name}: ${amount(pool.used, pool.bytes)} of ${amount(pool.total, pool.bytes)} in use`;
  return holders && holders.length ? `${base}\nheld by ${holders.join(", ")}` : base;
}

function renderClusterPools(s) {
  // Scarcest first: the pool most in use is the one to look at.
  const pools = [...s.pools].sort((a, b) => b.used / (b.total || 1) - a.used / (a.total || 1)
    || a.name.localeCompare(b.name));
  keyed($("cluster-pools"), nodesOf("cpools"), pools, (p) => p.name,
    (p) => {
      const row = el("div", "pool");
      row.dataset.pool = p.name;
      row.append(el("span", "name", p.name), makeBar());
      return row;
    },
    (row, p) => updateBar(row.lastChild, p.used, p.total,
      `${amount(p.used, p.bytes)} / ${amount(p.total, p.bytes)}`, poolTitle(p)));
}

function makeUnit(pool) {
  const unit = el("div", "unit");
  unit.dataset.pool = pool;
  unit.append(el("div", "fill"), el("span", "label"));
  return unit;
}

function updateUnit(node, pool, u) {
  setText(node.lastChild, u.label);
  node.firstChild.style.width = `${Math.min(1, u.used) * 100}%`;
  const cls = u.used >= 0.999 ? "unit busy" : u.used > 0 ? "unit busy part" : "unit";
  if (node.className !== cls) node.className = cls;
  setAttr(node, "data-unit", u.label);
  setAttr(node, "data-used", u.used);
  setAttr(node, "data-holders", u.holders.join(" "));
  if (u.holders.length) node.dataset.key = u.holders[0];
  else delete node.dataset.key;
  const use = u.used > 0 ? `${amount(u.used, false)} used, held by ${u.holders.join(", ")}` : "free";
  setAttr(node, "title", `${pool} ${u.label}: ${use}`);
}

function makeWorkerPool(p) {
  const row = el("div", "pool");
  row.dataset.pool = p.name;
  row.append(el("span", "name", p.name));
  if (p.units) row.append(el("div", "units"));
  else row.append(makeBar());
  return row;
}

function updateWorkerPool(row, p) {
  if (p.units) {
    const units = row.lastChild;
    if (!units._nodes) units._nodes = new Map();
    keyed(units, units._nodes, p.units, (u) => u.label, () => makeUnit(p.name),
      (node, u) => updateUnit(node, p.name, u));
  } else {
    updateBar(row.lastChild, p.used, p.total,
      `${amount(p.used, p.bytes)} / ${amount(p.total, p.bytes)}`, poolTitle(p, p.holders));
  }
}

function makeCard(w) {
  const card = el("div", "card");
  card.dataset.worker = w.name;
  const head = el("div", "card-head");
  head.append(el("span", "wname"), el("span", "addr"), el("span", "wstat"));
  const pools = el("div", "pools");
  pools._nodes = new Map();
  const running = el("div", "running-tasks");
  running._nodes = new Map();
  card.append(head, pools, running);
  return card;
}

function updateCard(card, w) {
  const [head, pools, running] = card.children;
  const [name, addr, stat] = head.children;
  setText(name, w.name);
  setText(addr, w.address);
  setText(stat, `${w.running}/${w.nthreads} thr${w.status === "running" ? "" : ` · ${w.status}`}`);
  setAttr(card, "title", `${w.name} ${w.address} (${w.status})`);
  const cls = `card ${w.status}`;
  if (card.className !== cls) card.className = cls;
  keyed(pools, pools._nodes, w.pools, (p) => `${p.name}/${p.units ? "u" : "a"}`,
    makeWorkerPool, updateWorkerPool);
  // Running tasks with what they hold: the keys to click for their story.
  keyed(running, running._nodes, w.tasks, (t) => t.key,
    (t) => {
      const line = el("div", "holders");
      line.append(keyLink(t.key), el("span", "held"));
      return line;
    },
    (line, t) => setText(line.lastChild, t.holding ? ` ${t.holding}` : ""));
}

function renderResources(s) {
  const cards = $("worker-cards");
  cards.classList.toggle("compact", s.workers.length > COMPACT_WORKERS);
  keyed(cards, nodesOf("cards"), s.workers, (w) => w.id, makeCard, updateCard);
  $("no-workers").hidden = s.workers.length > 0;
}

// ---------------------------------------------------------------- task stream

const stream = { rows: [], hits: [], tip: null };

const THREAD_ROWS = 64; // more threads than this: one row per worker, not per thread

/**
 * Rows: one per (worker, thread), workers in the status's order, then departed ones;
 * with many threads, one per worker (its executions overlap on that row).
 */
function streamRows(s, items) {
  const perThread = s.threads <= THREAD_ROWS;
  const rows = [];
  const index = new Map();
  const names = new Map();
  const add = (address, name, thread) => {
    const id = perThread ? `${address}|${thread}` : address;
    if (!index.has(id)) {
      index.set(id, rows.length);
      rows.push({ name, first: !perThread || thread === 0 });
    }
  };
  for (const w of s.workers) {
    names.set(w.address, w.name);
    for (let t = 0; t < (perThread ? w.nthreads : 1); t++) add(w.address, w.name, t);
  }
  for (const it of items) add(it[1], names.get(it[1]) || it[1], it[2]);
  const rowOf = (it) => index.get(perThread ? `${it[1]}|${it[2]}` : it[1]);
  return { rows, rowOf };
}

function drawStream() {
  const canvas = $("stream-canvas");
  const s = state.status;
  if (!s) return;
  const span = Number($("stream-window").value) || 60;
  const now = schedulerNow();
  const from = now - span;
  const items = state.stream.filter((it) => it[6] >= from);
  const { rows, rowOf } = streamRows(s, items);
  const labelW = 110;
  const cssW = canvas.clientWidth || 600;
  const rowH = Math.max(2, Math.min(22, Math.floor(400 / Math.max(1, rows.length))));
  const cssH = Math.max(60, rows.length * rowH + 18);
  canvas.style.height = `${cssH}px`;
  const dpr = window.devicePixelRatio || 1;
  if (canvas.width !== Math.round(cssW * dpr) || canvas.height !== Math.round(cssH * dpr)) {
    canvas.width = Math.round(cssW * dpr);
    canvas.height = Math.round(cssH * dpr);
  }
  const ctx = canvas.getContext("2d");
  ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
  ctx.clearRect(0, 0, cssW, cssH);
  const plotW = cssW - labelW - 4;
  const x = (t) => labelW + ((t - from) / span) * plotW;
  // Row labels and guides; a label only where a worker's rows begin.
  ctx.font = "11px system-ui, sans-serif";
  ctx.textBaseline = "middle";
  let labelledTo = -Infinity; // labels at least 12 px apart; the rest are in the tooltip
  rows.forEach((r, i) => {
    if (i % 2 && rowH >= 4) {
      ctx.fillStyle = "#141a22";
      ctx.fillRect(labelW, i * rowH, plotW, rowH);
    }
    if (r.first && i * rowH >= labelledTo) {
      ctx.fillStyle = "#8b97a8";
      const name = r.name.length > 16 ? `${r.name.slice(0, 15)}…` : r.name;
      ctx.fillText(name, 4, i * rowH + Math.max(rowH, 12) / 2, labelW - 8);
      labelledTo = i * rowH + 12;
      if (rowH >= 4) {
        ctx.fillStyle = "#273140";
        ctx.fillRect(labelW, i * rowH, plotW, 1);
      }
    }
  });
  // Time axis: ticks every nice step, labelled as seconds before now.
  const axisY = rows.length * rowH;
  const step = span <= 10 ? 2 : span <= 60 ? 10 : span <= 300 ? 60 : 180;
  ctx.fillStyle = "#8b97a8";
  ctx.textBaseline = "top";
  for (let back = 0; back <= span; back += step) {
    const px = x(now - back);
    ctx.fillRect(px, axisY, 1, 4);
    const label = back === 0 ? "now" : `-${back}s`;
    ctx.fillText(label, Math.min(px - ctx.measureText(label).width / 2, cssW - 26), axisY + 5);
  }
  const hits = [];
  for (const it of items) {
    const row = rowOf(it);
    const x0 = Math.max(labelW, x(it[5]));
    const w = Math.max(1, x(it[6]) - x0);
    const y = row * rowH + 1;
    const h = Math.max(1, rowH - 2);
    ctx.fillStyle = colourOf(it[4]);
    ctx.fillRect(x0, y, w, h);
    if (!it[7]) {
      // Failed: a red outline and cross-hatch, so it reads without colour too.
      ctx.strokeStyle = "#ef4444";
      ctx.lineWidth = 1.5;
      ctx.strokeRect(x0 + 0.75, y + 0.75, Math.max(1, w - 1.5), Math.max(1, h - 1.5));
      ctx.beginPath();
      for (let hx = x0; hx < x0 + w; hx += 5) {
        ctx.moveTo(hx, y + h);
        ctx.lineTo(Math.min(hx + h, x0 + w), y);
      }
      ctx.stroke();
    }
    hits.push([x0, y, w, h, it]);
  }
  stream.hits = hits;
  canvas.dataset.items = String(hits.length);
  canvas.dataset.total = String(state.stream.length);
  canvas.dataset.failed = String(items.filter((it) => !it[7]).length);
}

function workerName(address) {
  const w = state.status && state.status.workers.find((x) => x.address === address);
  return w ? `${w.name} (${address})` : address;
}

function streamHit(event) {
  const canvas = $("stream-canvas");
  const box = canvas.getBoundingClientRect();
  const px = event.clientX - box.left;
  const py = event.clientY - box.top;
  // Newest last: search backwards so the topmost rectangle wins; tiny ones get 2 px slack.
  for (let i = stream.hits.length - 1; i >= 0; i--) {
    const [x0, y, w, h, it] = stream.hits[i];
    if (px >= x0 - 2 && px <= x0 + w + 2 && py >= y && py <= y + h) return { it, px, py };
  }
  return null;
}

function setupStream() {
  const canvas = $("stream-canvas");
  const tip = $("stream-tip");
  canvas.addEventListener("mousemove", (event) => {
    const hit = streamHit(event);
    if (!hit) {
      tip.hidden = true;
      canvas.style.cursor = "";
      return;
    }
    const [, worker, thread, key, group, start, stop, ok, resources] = hit.it;
    const held = Object.entries(resources || {}).map(([k, v]) => `${k}=${v}`).join(" ");
    tip.textContent = `${key}\ngroup ${group}\n${duration(stop - start)}${ok ? "" : "  FAILED"}\n`
      + `${workerName(worker)} thread ${thread}\nended ${ago(schedulerNow() - stop)}${held ? `\nheld ${held}` : ""}`;
    tip.hidden = false;
    const left = Math.min(hit.px + 12, canvas.clientWidth - tip.offsetWidth - 4);
    tip.style.left = `${Math.max(0, left)}px`;
    tip.style.top = `${hit.py + 14}px`;
    canvas.style.cursor = "pointer";
  });
  canvas.addEventListener("mouseleave", () => { tip.hidden = true; });
  canvas.addEventListener("click", (event) => {
    const hit = streamHit(event);
    if (hit) openStory(hit.it[3]);
  });
  $("stream-window").addEventListener("change", drawStream);
}

// ---------------------------------------------------------------- progress

// Cancelled tasks are a part of their own: a user's choice, never drawn as failures.
const GROUP_PARTS = ["done", "memory", "processing", "queued", "waiting", "failed", "cancelled"];

/** A stacked bar from [class, count] parts; the parts' sum is the whole. */
function updateStack(stack, parts, title) {
  const total = parts.reduce((sum, [, n]) => sum + n, 0) || 1;
  while (stack.children.length < parts.length) stack.append(el("span"));
  parts.forEach(([cls, n], i) => {
    const seg = stack.children[i];
    if (seg.className !== cls) seg.className = cls;
    seg.style.width = `${(n / total) * 100}%`;
    setAttr(seg, "title", `${cls}: ${n}`);
  });
  setAttr(stack, "title", title);
}

function progressRow(container, nodes, items, idOf, partsOf, numsOf) {
  // Three grid cells per item (name, bar, numbers), kept together as one fragment id.
  keyed(container, nodes, items, idOf,
    () => {
      const row = el("div", "prow");
      row.style.display = "contents";
      row.append(el("span", "gname"), el("div", "stack"), el("span", "nums"));
      return row;
    },
    (row, item) => {
      const [name, stack, nums] = row.children;
      setText(name, item.name);
      setAttr(name, "title", item.name);
      setAttr(row, "data-group", item.name);
      const text = numsOf(item);
      updateStack(stack, partsOf(item), `${item.name}: ${text}`);
      setText(nums, text);
    });
}

function renderProgress(s) {
  progressRow($("group-bars"), nodesOf("groups"), s.groups, (g) => g.name,
    (g) => {
      // `done` counts finished executions; those still in memory are drawn apart.
      const memory = g.memory || 0;
      return [["done", Math.max(0, g.done - memory)], ["memory", memory],
        ["processing", g.processing || 0], ["queued", g.queued || 0],
        ["waiting", g.waiting || 0], ["failed", g.failed || 0], ["cancelled", g.cancelled || 0]];
    },
    (g) => {
      const total = Math.max(g.done, g.memory || 0) + (g.processing || 0) + (g.queued || 0)
        + (g.waiting || 0) + (g.failed || 0) + (g.cancelled || 0);
      const extra = GROUP_PARTS.slice(2).filter((k) => g[k]).map((k) => `${g[k]} ${k}`);
      return `${g.done}/${total}${extra.length ? ` · ${extra.join(" · ")}` : ""}`;
    });
  const arrays = s.runs ? s.runs.arrays || [] : [];
  const RUN_PARTS = ["completed", "running", "queued", "staged", "failed", "lost", "cancelled"];
  progressRow($("array-bars"), nodesOf("arrays"), arrays, (a) => String(a.id),
    (a) => RUN_PARTS.map((k) => [k, a[k] || 0]),
    (a) => {
      const extra = RUN_PARTS.slice(1).filter((k) => a[k]).map((k) => `${a[k]} ${k}`);
      return `${a.completed || 0}/${a.total}${extra.length ? ` · ${extra.join(" · ")}` : ""}`;
    });
  $("progress-empty").hidden = s.groups.length + arrays.length > 0;
}

// ---------------------------------------------------------------- pending

/** The reason a request waits: its first line, or all of it once clicked open. */
function showWhy(why) {
  const full = why.dataset.full || "";
  setText(why, why.classList.contains("folded") ? full.split("\n", 1)[0] : full);
}

function renderPending(s) {
  // Requests that can never be met first: they are the ones that need a person.
  const kinds = [...s.pending].sort((a, b) => Number(b.unsatisfiable) - Number(a.unsatisfiable));
  keyed($("pending-list"), nodesOf("pending"), kinds,
    (p) => `${p.request}|${(p.workers || []).join(",")}`,
    () => {
      const li = el("li");
      const head = el("div");
      head.append(el("span", "req"), el("span", "badge", "unsatisfiable"), el("span", "count"));
      const why = el("pre", "why folded");
      why.title = "click to show all";
      why.addEventListener("click", () => {
        why.classList.toggle("folded");
        showWhy(why);
      });
      li.append(head, el("div", "oldest"), why);
      return li;
    },
    (li, p) => {
      const [head, oldest, why] = li.children;
      const [req, badge, count] = head.children;
      li.className = p.unsatisfiable ? "unsatisfiable" : "";
      setText(req, p.request + (p.workers ? ` on ${p.workers.join(", ")}` : ""));
      badge.hidden = !p.unsatisfiable;
      setText(count, ` × ${p.count}`);
      if (oldest.dataset.key !== p.oldest) {
        oldest.replaceChildren(el("span", "count", "oldest "), keyLink(p.oldest));
        oldest.dataset.key = p.oldest;
      }
      why.dataset.full = p.why;
      why.classList.toggle("more", p.why.includes("\n"));
      showWhy(why);
    });
  const total = s.pending.reduce((sum, p) => sum + p.count, 0);
  const plural = (n, word) => `${n} ${word}${n === 1 ? "" : "s"}`;
  setText($("pending-count"), total ? `${plural(total, "task")}, ${plural(s.pending.length, "kind")}` : "");
  $("pending-empty").hidden = s.pending.length > 0;
}

// ---------------------------------------------------------------- shares

/** Amounts as `GPU=2 memory=4 GiB threads=3`, bytes for byte pools. */
function amounts(values, byteNames) {
  const parts = Object.entries(values || {}).map(([name, v]) => `${name}=${amount(v, byteNames.has(name))}`);
  return parts.join(" ") || "–";
}

const percent = (f) => `${Math.round(f * 100)}%`;

function renderShares(s) {
  const shares = s.shares || [];
  const byteNames = new Set(s.pools.filter((p) => p.bytes).map((p) => p.name));
  keyed($("share-rows"), nodesOf("shares"), shares, (r) => r.share,
    () => {
      const tr = el("tr");
      const name = el("td");
      name.append(el("span", "name"), el("span", "kind"));
      const dominant = el("td");
      dominant.append(makeBar());
      tr.append(name, el("td", "num"), el("td", "wrap"), dominant, el("td"), el("td", "wrap"));
      return tr;
    },
    (tr, r) => {
      const [name, weight, held, dominant, quota, waiting] = tr.children;
      setText(name.firstChild, r.name);
      setAttr(name, "title", r.kind === "person" ? `person ${r.name}` : `${r.kind} ${r.share}`);
      setText(name.lastChild, r.kind === "person" ? "" : r.kind);
      setText(weight, r.weight);
      setText(held, amounts(r.held, byteNames));
      const most = r.dominant;
      const holds = r.quota_holds;
      // Below its fair share with work waiting that its quota does not hold: owed more.
      const below = most.fraction < r.fair && r.waiting.count > (holds ? holds.count : 0);
      dominant.classList.toggle("below", below);
      updateBar(dominant.firstChild, most.fraction, 1,
        `${most.resource ? `${most.resource} ${percent(most.fraction)}` : "0%"} / ${percent(r.fair)}`,
        `holds ${percent(most.fraction)} of the cluster's ${most.resource || "resources"}; `
        + `its fair share is ${percent(r.fair)}${below ? " (below it, with work waiting)" : ""}`);
      setText(quota, r.quota ? amounts(r.quota, byteNames) : "–");
      const w = r.waiting;
      const asks = w.requests.map((q) => `${q.request} × ${q.count}`).join(", ");
      let text = w.count ? `${w.count} (${asks})` : "–";
      if (holds) {
        const some = holds.count === w.count ? "" : `${holds.count} `;
        text += `; ${some}held by quota ${amounts(holds.resources, byteNames)}`;
      }
      setText(waiting, text);
      waiting.classList.toggle("held-by-quota", Boolean(holds));
      setAttr(tr, "data-share", r.share);
      setAttr(tr, "data-name", r.name);
      setAttr(tr, "data-kind", r.kind);
      setAttr(tr, "data-dominant", most.fraction);
      setAttr(tr, "data-fair", r.fair);
      setAttr(tr, "data-waiting", w.count);
      setAttr(tr, "data-quota-held", holds ? holds.count : 0);
    });
  setText($("shares-count"), shares.length ? String(shares.length) : "");
  $("shares-empty").hidden = shares.length > 0;
  $("share-table").hidden = shares.length === 0;
}

// ---------------------------------------------------------------- workers table

const WORKER_CELLS = ["name", "host", "nthreads", "running", "memory", "cpu", "spilled",
  "stored", "results", "received", "sent", "status"];
const NUMERIC = new Set(["nthreads", "running", "cpu", "spilled", "stored", "results", "received", "sent"]);

function renderWorkerTable(s) {
  keyed($("worker-rows"), nodesOf("wrows"), s.workers, (w) => w.id,
    () => {
      const tr = el("tr");
      for (const c of WORKER_CELLS) {
        const td = el("td", NUMERIC.has(c) ? "num" : "");
        if (c === "memory") td.append(makeBar());
        tr.append(td);
      }
      return tr;
    },
    (tr, w) => {
      const cells = tr.children;
      const text = {
        name: w.name, host: w.host, nthreads: w.nthreads, running: w.running,
        cpu: `${Math.round(w.cpu)} %`, spilled: bytes(w.spilled), stored: bytes(w.stored),
        results: w.results, received: bytes(w.received), sent: bytes(w.sent), status: w.status,
      };
      WORKER_CELLS.forEach((c, i) => {
        if (c === "memory") {
          const limit = w.memory_limit || 0;
          updateBar(cells[i].firstChild, limit ? w.memory : 0, limit,
            limit ? `${bytes(w.memory)} / ${bytes(limit)}` : `${bytes(w.memory)} (no limit)`);
        } else setText(cells[i], text[c]);
      });
      setAttr(tr, "data-worker", w.name);
    });
}

// ---------------------------------------------------------------- runs (job queue)

function epochAgo(t) {
  // Run times are epoch seconds (the journal's), unlike the scheduler's clock.
  return t ? ago(Date.now() / 1000 - t) : "";
}

function renderRuns(s) {
  const runs = s.runs;
  $("runs-none").hidden = Boolean(runs);
  $("run-table").hidden = !runs;
  if (!runs) {
    $("run-counts").replaceChildren();
    return;
  }
  const counts = Object.entries(runs.counts || {}).filter(([, n]) => n > 0);
  keyed($("run-counts"), nodesOf("runchips"), counts, ([k]) => k,
    ([k]) => el("span", `chip ${k}`), (node, [k, n]) => setText(node, `${k} ${n}`));
  keyed($("run-rows"), nodesOf("runrows"), runs.recent || [], (r) => String(r.id),
    (r) => {
      const tr = el("tr");
      for (let i = 0; i < 8; i++) tr.append(el("td", i === 7 ? "num" : i === 3 || i === 6 ? "wrap" : ""));
      tr.addEventListener("click", () => openLog(tr.dataset.run, tr.dataset.label));
      return tr;
    },
    (tr, r) => {
      const outcome = typeof r.exit === "number" ? `exit ${r.exit}` : r.exit; // "exit 1", "SIGKILL"
      const cells = [r.id, r.label || "", r.state, r.command || "", r.worker || "", r.held || "",
        [outcome, r.reason, r.waiting].filter(Boolean).join(" · "), epochAgo(r.started || r.created)];
      cells.forEach((v, i) => setText(tr.children[i], v));
      tr.children[2].className = `state-${r.state}`;
      tr.dataset.run = String(r.id);
      tr.dataset.label = r.label || String(r.id);
      setAttr(tr, "title", `run ${r.id}: click for its log (attempts ${r.attempts ?? 0})`);
    });
}

// ---------------------------------------------------------------- events

function renderEvents(s) {
  const list = $("event-list");
  const items = state.events.slice(-EVENTS_KEEP).reverse(); // newest first
  keyed(list, nodesOf("events"), items, (e) => String(e[0]),
    (e) => {
      const li = el("li", `lvl-${String(e[2]).toLowerCase()}`);
      li.append(el("span", "ago"), el("span", "text", e[3]));
      li.title = `${e[2]} #${e[0]}`;
      return li;
    },
    (li, e) => setText(li.firstChild, ago(s.now - e[1])));
  setText($("events-count"), state.events.length ? String(state.events.length) : "");
  $("events-empty").hidden = state.events.length > 0;
}

// ---------------------------------------------------------------- panel: story, log

let panelFor = null; // what the panel shows; a late reply for something else is dropped

function showPanel(title) {
  $("panel").hidden = false;
  setText($("panel-title"), title);
  $("panel-body").replaceChildren(el("p", "empty", "loading…"));
}

async function openStory(key) {
  panelFor = `story:${key}`;
  showPanel(`story of ${key}`);
  const asked = panelFor;
  const body = $("panel-body");
  try {
    const reply = await fetch(`api/story?key=${encodeURIComponent(key)}`, { credentials: "same-origin" });
    if (!reply.ok) throw new Error(`${reply.status} ${reply.statusText}`);
    const data = await reply.json();
    if (panelFor !== asked) return;
    if (!data.story.length) {
      body.replaceChildren(el("p", "empty", "the scheduler keeps no story for this key"));
      return;
    }
    const table = el("table", "story");
    const head = el("tr");
    for (const h of ["when", "key", "from", "to", "cause"]) head.append(el("th", "", h));
    table.append(el("thead"), el("tbody"));
    table.tHead.append(head);
    for (const [time, k, from, to, cause] of data.story) {
      const tr = el("tr");
      tr.append(el("td", "num", `-${(data.now - time).toFixed(3)} s`), el("td", "mono", k),
        el("td", "", from), el("td", "", to), el("td", "mono", cause));
      table.tBodies[0].append(tr);
    }
    body.replaceChildren(table);
  } catch (err) {
    if (panelFor === asked) body.replaceChildren(el("p", "empty", `could not load the story: ${err.message}`));
  }
}

async function openLog(id, label) {
  panelFor = `log:${id}`;
  showPanel(`log of run ${label}`);
  const asked = panelFor;
  const body = $("panel-body");
  try {
    const reply = await fetch(`api/runs/${encodeURIComponent(id)}/log?tail=65536`, { credentials: "same-origin" });
    if (!reply.ok) throw new Error(`${reply.status} ${reply.statusText}`);
    const text = await reply.text();
    if (panelFor !== asked) return;
    body.replaceChildren(el("pre", "", text || "(empty log)"));
    body.scrollTop = body.scrollHeight; // a tail: its end is what matters
  } catch (err) {
    if (panelFor === asked) body.replaceChildren(el("p", "empty", `could not load the log: ${err.message}`));
  }
}

function setupPanel() {
  const close = () => {
    $("panel").hidden = true;
    panelFor = null;
  };
  $("panel-close").addEventListener("click", close);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") close(); });
  // Any element carrying a task key opens its story: unit holders, pending, running.
  document.addEventListener("click", (e) => {
    const target = e.target.closest("[data-key]");
    if (target && !target.closest("#panel")) openStory(target.dataset.key);
  });
}

// ---------------------------------------------------------------- the stream of statuses

/** Take one status: keep the increments (bounded), then redraw every section. */
function receive(s) {
  const began = performance.now();
  const restarted = s.scheduler.id !== state.schedulerId || s.stream.seq < state.streamSeq
    || s.events.seq < state.eventsSeq;
  if (restarted) {
    // Another scheduler, or the same one started afresh: its numbers begin again.
    state.schedulerId = s.scheduler.id;
    state.stream = [];
    state.events = [];
    state.streamSeq = 0;
    state.eventsSeq = 0;
  }
  // A reconnection's first message repeats what was seen: keep only newer numbers.
  for (const it of s.stream.items) if (it[0] > state.streamSeq) state.stream.push(it);
  for (const e of s.events.items) if (e[0] > state.eventsSeq) state.events.push(e);
  state.streamSeq = s.stream.seq;
  state.eventsSeq = s.events.seq;
  if (state.stream.length > STREAM_KEEP) state.stream.splice(0, state.stream.length - STREAM_KEEP);
  if (state.events.length > EVENTS_KEEP) state.events.splice(0, state.events.length - EVENTS_KEEP);
  state.status = s;
  state.receivedAt = performance.now();
  const errors = [];
  for (const render of [showAge, renderHeader, renderClusterPools, renderResources, renderShares,
    renderPending, renderProgress, renderWorkerTable, renderRuns, renderEvents, drawStream]) {
    try {
      render(s);
    } catch (err) {
      errors.push(err); // one section failing must not blank the others
    }
  }
  document.body.dataset.updates = String(Number(document.body.dataset.updates || 0) + 1);
  document.body.dataset.renderMs = (performance.now() - began).toFixed(1); // to watch its cost
  if (errors.length) throw errors[0]; // still reported, as an uncaught error
}

function setConnection(text) {
  const conn = $("connection");
  setText(conn, text);
  conn.className = `conn ${text}`;
}

function connect() {
  // ?interval=0.2 on the page's address is passed on (the server bounds it).
  const interval = new URLSearchParams(window.location.search).get("interval");
  const source = new EventSource(interval ? `events?interval=${encodeURIComponent(interval)}` : "events");
  source.addEventListener("open", () => setConnection("live"));
  source.addEventListener("status", (event) => {
    setConnection("live");
    receive(JSON.parse(event.data));
  });
  // EventSource retries by itself while readyState is CONNECTING; CLOSED is final
  // (a refused session, say): then the page must be reloaded through a login link.
  source.addEventListener("error", () => {
    setConnection(source.readyState === EventSource.CLOSED ? "closed" : "reconnecting");
  });
}

function showAge() {
  const age = (performance.now() - state.receivedAt) / 1000;
  const node = $("update-age");
  setText(node, `updated ${age < 1 ? "just now" : `${Math.round(age)} s ago`}`);
  node.classList.toggle("stale", age > 5);
}

function tick() {
  // Between messages: the age of the data, and the stream scrolling with time.
  if (state.status) {
    showAge();
    drawStream();
  }
}

function start() {
  setupStream();
  setupPanel();
  window.addEventListener("resize", drawStream);
  connect();
  setInterval(tick, 500);
}

start();
