// The Disbatch dashboard: plain JavaScript, no build step. It reads the v1
// API (/api/v1/...) and follows /api/v1/events; 4.103's balance routes for
// the balance editor. See web/ui/doc.go.
'use strict';

const main = document.getElementById('main');
const CFG = JSON.parse(main.dataset.config || '{}');
const ROLES = { read: 1, write: 2, admin: 3 };
// stats: what the page did, for the benchmark and the curious (console).
const stats = window.disbatchStats = { events: 0, renders: 0 };
const can = (role) => (ROLES[CFG.role] || 0) >= ROLES[role];

// ---------------------------------------------------------------- helpers

// h builds an element: h('a', {href: '/', class: 'x', onclick: fn}, 'text', child).
// SVG elements: their names, or 'svg:a' for an SVG link.
function h(tag, attrs, ...children) {
  const svg = ['svg', 'path', 'rect', 'line', 'text', 'g', 'title', 'circle'].includes(tag) || tag.startsWith('svg:');
  if (tag.startsWith('svg:')) tag = tag.slice(4);
  const el = svg ? document.createElementNS('http://www.w3.org/2000/svg', tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
    else if (k === 'text') el.textContent = v;
    else if (k === 'value' && !svg) el.value = v;
    else if (k === 'checked' || k === 'disabled' || k === 'selected') el[k] = !!v;
    else el.setAttribute(k, v === true ? '' : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// fill replaces el's children, leaving out null, undefined and false.
// Live pages redraw as the database changes:
// the element that had the keyboard focus is focused again when the new
// content holds one of its id, so a redraw does not send a keyboard
// user back to the page's start.
function fill(el, ...children) {
  const had = document.activeElement;
  const id = had && had !== document.body && el.contains(had) ? had.id : '';
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
  if (id && document.activeElement !== had) {
    const now = document.getElementById(id);
    if (now && el.contains(now)) now.focus({ preventScroll: true });
  }
}

class APIError extends Error {
  constructor(status, body) {
    const e = (body && (body.error ?? body.status)) || {}; // v1's shape, or 4.103's {"status": "failed: …"}
    super(typeof e === 'string' ? e : (e.message || ('HTTP ' + status)));
    this.status = status; this.code = e.code; this.field = e.field;
  }
}

async function api(method, url, body) {
  const opt = { method, headers: { Accept: 'application/json' }, credentials: 'same-origin' };
  if (body !== undefined) { opt.headers['Content-Type'] = 'application/json'; opt.body = JSON.stringify(body); }
  const res = await fetch(url, opt);
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text }; }
  if (!res.ok) throw new APIError(res.status, data);
  return data;
}

let toastTimer;
function toast(msg, bad) {
  const t = document.getElementById('toast');
  t.textContent = msg; t.className = 'toast' + (bad ? ' bad' : ''); t.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { t.hidden = true; }, bad ? 8000 : 4000);
}

// confirmAction asks in a modal dialog; resolves true on Confirm.
function confirmAction(text, okLabel) {
  const d = document.getElementById('confirm');
  document.getElementById('confirm-text').textContent = text;
  document.getElementById('confirm-ok').textContent = okLabel || 'Confirm';
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.returnValue = 'cancel';
    d.showModal();
  });
}

// act runs an action behind a button: disabled while it runs, errors shown.
async function act(btn, fn) {
  if (btn) btn.disabled = true;
  try { return await fn(); } catch (e) { toast(e.message, true); } finally { if (btn) btn.disabled = false; }
}

// throttle calls fn at most once per ms: at once when it has not run for
// ms, else at the end of that span; calls while it runs make it run once
// more. Live updates are coalesced into a few renders a second whatever
// the event rate. Counters are projections that trail the events by a
// moment, so a burst of calls also ends with one more run ms*2 after the
// last call (the projected counts settled).
function throttle(fn, ms) {
  let timer = null, again = false, running = false, last = 0, settle = null;
  const gen = pageGen; // a page's throttles stop when another page replaces it
  const fire = async () => {
    timer = null;
    if (gen !== pageGen) return;
    running = true; again = false; last = Date.now();
    stats.renders++;
    try { await fn(); } catch (e) { console.warn(e); }
    running = false;
    if (again) schedule();
  };
  const schedule = () => {
    if (timer) return;
    timer = setTimeout(fire, Math.max(0, last + ms - Date.now()));
  };
  const call = () => {
    clearTimeout(settle);
    settle = setTimeout(() => { settle = null; if (running) again = true; else schedule(); }, ms * 2);
    if (running) { again = true; return; }
    schedule();
  };
  call.now = () => { clearTimeout(timer); timer = null; fire(); };
  return call;
}

const fmtN = (n) => (n === null || n === undefined) ? '–' : Number(n).toLocaleString('en');
function fmtTime(s) {
  if (!s) return '–';
  const d = new Date(s);
  return isNaN(d) ? String(s) : d.toLocaleString('sv-SE', { hour12: false }).replace(' ', ' ') + '.' + String(d.getMilliseconds()).padStart(3, '0');
}
function fmtAge(ms) {
  if (ms === null || ms === undefined) return '–';
  const s = ms / 1000;
  if (s < 60) return s.toFixed(s < 10 ? 1 : 0) + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  return (s / 3600).toFixed(1) + ' h';
}
const badge = (name, extra) => h('span', { class: 'badge s-' + (name || 'unknown') }, extra || name || '?');
const clip = (s, n) => (s.length > n ? s.slice(0, n - 1) + '…' : s);
const STATUS_NAMES = { '-6': 'orphaned', '-5': 'cancelled', '-4': 'blocked', '-3': 'terminated', '-2': 'queued', '-1': 'claimed', '0': 'running', '1': 'succeeded', '2': 'failed' };
const statusName = (code) => STATUS_NAMES[String(code)] || String(code);

// ------------------------------------------------------------ live events

// Rates: per queue, finished tasks in 10 s buckets over the last 5 min,
// counted from the events since the page opened.
const BUCKET_MS = 10000, BUCKETS = 30;
const rates = new Map();
function countFinish(queue, at) {
  const b = Math.floor(at / BUCKET_MS);
  let r = rates.get(queue);
  if (!r) { r = new Map(); rates.set(queue, r); }
  r.set(b, (r.get(b) || 0) + 1);
  for (const k of r.keys()) if (k <= b - BUCKETS) r.delete(k);
}
function rateSeries(queue) {
  const now = Math.floor(Date.now() / BUCKET_MS);
  const r = rates.get(queue) || new Map();
  const out = [];
  for (let b = now - BUCKETS + 1; b <= now; b++) out.push(r.get(b) || 0);
  return out;
}

// HIDDEN_PAUSE_MS is how long a hidden tab keeps its event stream.
const HIDDEN_PAUSE_MS = 5000;

const live = {
  es: null, listeners: new Set(), state: 'connecting', tries: 0, reopened: false, hideTimer: null, retryTimer: null,
  start() {
    if (!window.EventSource) { this.set('off', 'no live events in this browser'); return; }
    // A tab hidden for HIDDEN_PAUSE_MS lets its stream go, and takes it up
    // again when shown, the page reading everything anew: over HTTP/1.1 a
    // browser keeps six connections to a server and each tab's stream
    // held one for good (a seventh tab hung), and the server sent every
    // hidden tab every event.
    document.addEventListener('visibilitychange', () => this.visibility());
    this.open();
  },
  visibility() {
    clearTimeout(this.hideTimer);
    if (document.visibilityState === 'hidden') {
      this.hideTimer = setTimeout(() => this.pause(), HIDDEN_PAUSE_MS);
    } else if (this.state === 'paused') {
      this.set('off', 'reconnecting…');
      this.open();
    }
  },
  pause() {
    clearTimeout(this.retryTimer);
    if (this.es) this.es.close();
    this.es = null;
    this.reopened = true; // shown again, the page reads everything anew
    this.set('paused', 'paused while hidden');
  },
  // open follows the events. The browser reconnects by itself after a
  // dropped stream, resuming from the last id; an answer other than 200 (a
  // server starting or stopping, a proxy's 502) closes the EventSource for
  // good, so a new one is opened after a backoff, and, since it resumes
  // from nothing, the page is told to read everything again (a reset).
  open() {
    const es = new EventSource('/api/v1/events');
    this.es = es;
    es.onopen = () => {
      this.set('on', 'live');
      this.tries = 0;
      if (this.reopened) {
        this.reopened = false;
        for (const fn of this.listeners) fn('reset', { type: 'reset', reason: 'reconnected' });
      }
    };
    es.onerror = () => {
      this.set('off', 'reconnecting…');
      if (es.readyState !== EventSource.CLOSED) return; // the browser retries
      es.close();
      this.reopened = true;
      this.retryTimer = setTimeout(() => { if (this.state !== 'paused') this.open(); }, Math.min(30000, 1000 * 2 ** this.tries++));
    };
    for (const type of ['task', 'queue', 'node', 'reset']) {
      es.addEventListener(type, (e) => {
        let d;
        stats.events++;
        try { d = JSON.parse(e.data); } catch { return; }
        if (type === 'task' && d.to !== null && d.to > 0 && !(d.from > 0)) countFinish(d.queue, Date.parse(d.time) || Date.now());
        for (const fn of this.listeners) fn(type, d);
      });
    }
  },
  set(state, text) {
    this.state = state;
    const el = document.getElementById('live');
    el.className = 'live ' + state; el.textContent = text;
  },
  on(fn) { this.listeners.add(fn); return () => this.listeners.delete(fn); },
};

// ------------------------------------------------------------------ router

const routes = [
  [/^\/$/, 'overview', overviewPage],
  [/^\/ui\/?$/, 'overview', overviewPage],
  [/^\/ui\/queues\/([^/]+)$/, 'overview', queuePage],
  [/^\/ui\/tasks\/([0-9a-f]{24})$/, 'overview', taskPage],
  [/^\/ui\/nodes$/, 'nodes', nodesPage],
  [/^\/ui\/submit$/, 'submit', submitPage],
  [/^\/balance$/, 'balance', balancePage],
];
let current = null; // {dispose()}
let pageGen = 0; // counts the pages shown: what an older page does later is dropped

function render() {
  if (current && current.dispose) current.dispose();
  current = null;
  pageGen++;
  const path = location.pathname;
  for (const [re, nav, page] of routes) {
    const m = path.match(re);
    if (!m) continue;
    for (const a of document.querySelectorAll('.top nav a')) {
      if (a.dataset.page === nav) a.setAttribute('aria-current', 'page'); else a.removeAttribute('aria-current');
    }
    fill(main, h('p', { class: 'muted' }, 'Loading…'));
    current = page(...m.slice(1).map(decodeURIComponent)) || null;
    return;
  }
  fill(main, h('h1', {}, 'No such page'), h('p', {}, h('a', { href: '/', 'data-nav': true }, 'Back to the overview')));
}

function go(url) {
  history.pushState(null, '', url);
  render();
  main.focus({ preventScroll: true });
  window.scrollTo(0, 0);
}

document.addEventListener('click', (e) => {
  const a = e.target.closest && e.target.closest('a[data-nav]');
  if (!a || e.defaultPrevented || e.button !== 0 || e.metaKey || e.ctrlKey || e.shiftKey || e.altKey) return;
  e.preventDefault();
  go(a.getAttribute('href'));
});
window.addEventListener('popstate', render);

// page mounts a page: live events go to onEvent while it is shown, and
// its timers stop when another page replaces it.
function page({ onEvent, every }) {
  const offs = [];
  if (onEvent) offs.push(live.on(onEvent));
  // Polls skip a hidden tab: shown again, its stream's reset reads anew.
  for (const [ms, fn] of every || []) { const t = setInterval(() => { if (document.visibilityState !== 'hidden') fn(); }, ms); offs.push(() => clearInterval(t)); }
  return { dispose() { offs.forEach((f) => f()); } };
}

// ----------------------------------------------------------------- overview

function spark(series) {
  const max = Math.max(1, ...series), w = 90, hgt = 20;
  const pts = series.map((v, i) => (i * w / (series.length - 1)).toFixed(1) + ',' + (hgt - 1 - v * (hgt - 2) / max).toFixed(1));
  return h('svg', { class: 'spark', viewBox: `0 0 ${w} ${hgt}`, role: 'img', 'aria-label': 'finished per 10 s over the last 5 minutes' },
    h('path', { d: 'M' + pts.join('L') }));
}

function queueRow(q) {
  const c = q.counts || {};
  const series = rateSeries(q.id);
  const lastMin = series.slice(-6).reduce((a, b) => a + b, 0) / 60;
  return h('tr', { 'data-queue': q.name },
    h('td', {}, h('a', { href: '/ui/queues/' + encodeURIComponent(q.name), 'data-nav': true }, q.name)),
    h('td', { class: 'num', 'data-col': 'queued' }, fmtN(c.queued)),
    h('td', { class: 'num', 'data-col': 'running' }, fmtN(c.running)),
    h('td', { class: 'num', 'data-col': 'finished' }, fmtN(c.finished)),
    h('td', { class: 'num', 'data-col': 'failed' }, c.failed ? h('a', { href: '/ui/queues/' + encodeURIComponent(q.name) + '?status=failed', 'data-nav': true, class: 's-failed' }, fmtN(c.failed)) : fmtN(c.failed)),
    h('td', {}, spark(series), ' ', h('span', { class: 'muted' }, lastMin.toFixed(1) + '/s')),
    h('td', { class: 'num hide-sm' }, q.priority ?? 0),
    h('td', { class: 'num hide-sm' }, q.weight ?? 20),
    h('td', { class: 'num hide-sm' }, q.max_running ? q.max_running : '–'),
    h('td', { class: 'hide-sm' }, q.plugin),
    h('td', {}, q.paused ? badge('paused') : ''));
}

// keyedRows makes body's rows those of items, in order, rebuilding only
// the rows whose signature changed: with a thousand queues, a live update
// touches the few that moved, not the whole table (layout is the cost).
function keyedRows(body, rows, items, key, sig, build) {
  const seen = new Set();
  let prev = null;
  for (const it of items) {
    const k = key(it), sg = sig(it);
    seen.add(k);
    let r = rows.get(k);
    if (!r || r.sig !== sg) {
      const tr = build(it);
      if (r) r.tr.replaceWith(tr);
      r = { tr, sig: sg };
      rows.set(k, r);
    }
    const want = prev ? prev.nextSibling : body.firstChild;
    if (want !== r.tr) body.insertBefore(r.tr, want);
    prev = r.tr;
  }
  for (const [k, r] of rows) if (!seen.has(k)) { r.tr.remove(); rows.delete(k); }
  while (prev && prev.nextSibling) prev.nextSibling.remove();
  if (!prev) body.replaceChildren();
}

// SILENT_MS: a node that does not say its --fence-after is called silent
// past the default one (10 s).
const SILENT_MS = 10000;
function nodeState(n) {
  if (n.dead) return 'dead';
  // Stopped first: a drained node exits with drain still set (its next
  // start clears it), and draining it is no more.
  if (n.state === 'stopped') return 'stopped';
  // No heartbeat for its --fence-after, as it says: a node that is alive
  // but cut off has fenced itself (stopped its tasks) by now, draining or
  // not (schema.Node.Fenced, which `node list` uses). A node that does not
  // say (4.103's never fences) is only silent.
  if (n.fence_after_ms > 0 && n.heartbeat_age_ms > n.fence_after_ms) return 'fenced';
  if (n.drain || n.state === 'draining') return 'draining';
  if (!(n.fence_after_ms > 0) && n.heartbeat_age_ms > SILENT_MS) return 'silent';
  return 'serving';
}
const nodeRunning = (n) => (n.queues || []).reduce((a, q) => a + (q.tasks_doing || 0), 0);

function nodeRowSimple(n) {
  const st = nodeState(n);
  return h('tr', { 'data-node': n.node },
    h('td', {}, n.node),
    h('td', {}, badge(st)),
    h('td', { class: 'num', 'data-age': n.heartbeat_age_ms ?? '' }, fmtAge(n.heartbeat_age_ms)),
    h('td', { class: 'num' }, nodeRunning(n) + ' / ' + (n.maxthreads ?? '∞')));
}

function overviewPage() {
  let queues = null, nodes = null, leases = null, loadedAt = Date.now();
  const rows = new Map(); // queue id → {tr, sig}
  const qBody = h('tbody'), nBody = h('tbody'), lease = h('div', { class: 'leases' });
  const summary = h('p', { class: 'muted' });
  fill(main, 
    h('h1', {}, 'Overview'), summary,
    h('section', { class: 'panel', 'aria-labelledby': 'h-queues' },
      h('h2', { id: 'h-queues' }, 'Queues'),
      h('div', { class: 'scroll' }, h('table', { id: 'queues' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Queue'), h('th', { class: 'num' }, 'Queued'), h('th', { class: 'num' }, 'Running'),
          h('th', { class: 'num' }, 'Done'), h('th', { class: 'num' }, 'Failed'), h('th', {}, 'Rate (5 min)'), h('th', { class: 'num hide-sm' }, 'Priority'),
          h('th', { class: 'num hide-sm' }, 'Weight'), h('th', { class: 'num hide-sm' }, 'Max running'), h('th', { class: 'hide-sm' }, 'Plugin'), h('th', {}, ''))),
        qBody))),
    h('section', { class: 'panel', 'aria-labelledby': 'h-nodes' },
      h('h2', { id: 'h-nodes' }, 'Nodes'), lease,
      h('div', { class: 'scroll' }, h('table', { id: 'nodes' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Node'), h('th', {}, 'State'), h('th', { class: 'num' }, 'Heartbeat'), h('th', { class: 'num' }, 'Running / max'))),
        nBody))));

  const drawQueues = () => {
    if (!queues) return;
    if (!queues.length) {
      rows.clear();
      fill(qBody, h('tr', {}, h('td', { colspan: 11, class: 'muted' }, 'No queues yet: create one with `disbatch queue create` or POST /api/v1/queues.')));
    } else {
      keyedRows(qBody, rows, queues, (q) => q.id, (q) => JSON.stringify([q.name, q.counts, q.priority, q.weight, q.max_running, q.plugin, q.paused, rateSeries(q.id)]), queueRow);
    }
    let queued = 0, running = 0;
    for (const q of queues) { queued += (q.counts && q.counts.queued) || 0; running += (q.counts && q.counts.running) || 0; }
    summary.textContent = `${fmtN(queues.length)} queues · ${fmtN(queued)} queued · ${fmtN(running)} running` + (nodes ? ` · ${nodes.filter((n) => ['serving', 'draining'].includes(nodeState(n))).length} live nodes` : '');
  };
  const drawNodes = () => {
    if (!nodes) return;
    const elapsed = Date.now() - loadedAt;
    fill(nBody, ...(nodes.length ? nodes.map((n) => nodeRowSimple({ ...n, heartbeat_age_ms: n.heartbeat_age_ms === null ? null : n.heartbeat_age_ms + elapsed }))
      : [h('tr', {}, h('td', { colspan: 4, class: 'muted' }, 'No node has written a heartbeat.'))]));
    fill(lease, ...(leases || []).map((l) => h('span', {}, h('strong', {}, l.name), ': ', l.owner, ' ',
      h('span', { class: 'muted' }, `epoch ${l.epoch}` + (l.expires_in_ms < 0 ? ' (lapsed)' : '')))));
  };
  const loadQueues = throttle(async () => {
    queues = (await api('GET', '/api/v1/queues')).queues;
    for (const q of queues) queueNames.set(q.id, q.name);
    drawQueues();
  }, 500);
  const loadNodes = throttle(async () => {
    const [n, c] = await Promise.all([api('GET', '/api/v1/nodes'), api('GET', '/api/v1/cluster')]);
    nodes = n.nodes; leases = c.leases; loadedAt = Date.now(); drawNodes(); drawQueues();
  }, 500);
  loadQueues.now(); loadNodes.now();
  return page({
    onEvent(type) {
      if (type === 'task' || type === 'queue' || type === 'reset') loadQueues();
      if (type === 'node' || type === 'reset') loadNodes();
    },
    every: [[1000, () => { drawNodes(); }], [5000, () => { loadNodes(); loadQueues(); }]],
  });
}

// -------------------------------------------------------------- queue page

const STATUSES = ['queued', 'blocked', 'claimed', 'running', 'succeeded', 'failed', 'cancelled', 'orphaned', 'terminated'];
const REASONS = ['killed', 'cancelled', 'timeout', 'expired', 'parent_failed', 'orphaned', 'retrying', 'requeued', 'rerun', 'fenced'];

function taskRow(t) {
  return h('tr', { 'data-task': t.id },
    h('td', {}, h('a', { href: '/ui/tasks/' + t.id, 'data-nav': true }, t.id)),
    h('td', {}, badge(t.status_name || statusName(t.status))),
    h('td', {}, t.reason || ''),
    h('td', {}, t.node || ''),
    h('td', { class: 'hide-sm' }, fmtTime(t.ctime)),
    h('td', { class: 'hide-sm' }, fmtTime(t.mtime)),
    h('td', { class: 'params', title: JSON.stringify(t.params) }, clip(JSON.stringify(t.params), 120)));
}

function queuePage(name) {
  let q = null, cursors = [''], pageNo = 0, next = null, shown = new Set();
  const head = h('div'), settings = h('section', { class: 'panel', 'aria-labelledby': 'h-settings' });
  const tbody = h('tbody'), pager = h('div', { class: 'row' });
  const f = {
    status: h('select', { name: 'status' }, h('option', { value: '' }, 'any'), STATUSES.map((s) => h('option', { value: s }, s))),
    reason: h('select', { name: 'reason' }, h('option', { value: '' }, 'any'), REASONS.map((s) => h('option', { value: s }, s))),
    node: h('input', { name: 'node', placeholder: 'node name', size: 12 }),
    after: h('input', { name: 'after', type: 'datetime-local', step: 1 }),
    before: h('input', { name: 'before', type: 'datetime-local', step: 1 }),
    param: h('input', { name: 'param', placeholder: 'key=value', size: 14 }),
    order: h('select', { name: 'order' }, h('option', { value: 'desc' }, 'newest first'), h('option', { value: 'asc' }, 'oldest first')),
  };
  const initial = new URLSearchParams(location.search);
  if (STATUSES.includes(initial.get('status'))) f.status.value = initial.get('status');
  if (REASONS.includes(initial.get('reason'))) f.reason.value = initial.get('reason');
  const bulk = h('div', { class: 'row' });
  fill(main, head,
    h('section', { class: 'panel', 'aria-labelledby': 'h-tasks' },
      h('h2', { id: 'h-tasks' }, 'Tasks'),
      h('form', { class: 'row', onsubmit: (e) => {
        e.preventDefault();
        try { applied = filterParams(); } catch (err) { toast(err.message, true); return; }
        cursors = ['']; pageNo = 0; loadTasks.now();
      } },
        h('label', {}, 'Status', f.status), h('label', {}, 'Reason', f.reason), h('label', {}, 'Node', f.node),
        h('label', {}, 'Created after', f.after), h('label', {}, 'Created before', f.before),
        h('label', {}, 'Parameter', f.param), h('label', {}, 'Order', f.order),
        h('button', { type: 'submit' }, 'Filter')),
      bulk,
      h('div', { class: 'scroll' }, h('table', { id: 'tasks' },
        h('thead', {}, h('tr', {}, h('th', {}, 'Task'), h('th', {}, 'Status'), h('th', {}, 'Reason'), h('th', {}, 'Node'),
          h('th', { class: 'hide-sm' }, 'Created'), h('th', { class: 'hide-sm' }, 'Changed'), h('th', {}, 'Parameters'))),
        tbody)),
      pager),
    settings);

  // filterParams is the form's filter as a Filter press applies it;
  // applied, the one the table shows: live refreshes keep to it while the
  // operator edits the form (they took half-typed edits, and a "key"
  // without "=" showed an error at every event).
  const filterParams = () => {
    const p = new URLSearchParams({ order: f.order.value });
    if (f.status.value) p.append('status', f.status.value);
    if (f.reason.value) p.append('reason', f.reason.value);
    if (f.node.value.trim()) p.append('node', f.node.value.trim());
    if (f.after.value) p.append('created_after', new Date(f.after.value).toISOString());
    if (f.before.value) p.append('created_before', new Date(f.before.value).toISOString());
    const kv = f.param.value.trim();
    if (kv) {
      const i = kv.indexOf('=');
      if (i < 1) throw new Error('parameter filter: write key=value');
      p.append(`param[${kv.slice(0, i).trim()}]`, kv.slice(i + 1));
    }
    return p;
  };
  let applied = filterParams();
  let asked = 0; // an answer to an older ask than the latest is dropped
  const query = () => {
    const p = new URLSearchParams(applied);
    p.set('queue', q ? q.id : name); p.set('limit', '50');
    if (cursors[pageNo]) p.append('cursor', cursors[pageNo]);
    return '/api/v1/tasks?' + p;
  };
  const loadTasks = throttle(async () => {
    let res;
    const mine = ++asked;
    try { res = await api('GET', query()); } catch (e) { if (mine === asked) toast(e.message, true); return; }
    if (mine !== asked) return;
    next = res.next;
    const before = shown;
    shown = new Set(res.tasks.map((t) => t.id));
    fill(tbody, ...(res.tasks.length ? res.tasks.map((t) => {
      const tr = taskRow(t);
      if (before.size && !before.has(t.id)) tr.classList.add('flash');
      return tr;
    }) : [h('tr', {}, h('td', { colspan: 7, class: 'muted' }, 'No tasks match.'))]));
    fill(pager, 
      h('button', { class: 'ghost', disabled: pageNo === 0, onclick: () => { pageNo--; loadTasks.now(); } }, '← Previous'),
      h('span', { class: 'muted' }, 'Page ' + (pageNo + 1)),
      h('button', { class: 'ghost', disabled: !next, onclick: () => { cursors[pageNo + 1] = next; pageNo++; loadTasks.now(); } }, 'Next →'));
  }, 200);

  const drawHead = () => {
    const c = q.counts || {};
    fill(head, 
      h('h1', {}, 'Queue ', q.name, ' ', q.paused ? badge('paused') : ''),
      h('div', { class: 'grid panel', id: 'queue-counts' },
        h('div', {}, h('div', { class: 'muted' }, 'Queued'), h('strong', { 'data-count': 'queued' }, fmtN(c.queued))),
        h('div', {}, h('div', { class: 'muted' }, 'Running'), h('strong', { 'data-count': 'running' }, fmtN(c.running))),
        h('div', {}, h('div', { class: 'muted' }, 'Done'), h('strong', { 'data-count': 'finished' }, fmtN(c.finished))),
        h('div', {}, h('div', { class: 'muted' }, 'Failed'), h('strong', { 'data-count': 'failed' }, fmtN(c.failed))),
        h('div', {}, h('div', { class: 'muted' }, 'Total'), h('strong', {}, fmtN(c.total))),
        h('div', {}, h('div', { class: 'muted' }, 'Plugin'), h('strong', {}, q.plugin)),
        h('div', {}, h('div', { class: 'muted' }, 'Rate (5 min)'), spark(rateSeries(q.id)))));
    if (can('write')) {
      fill(bulk, 
        h('button', { class: 'ghost', id: 'bulk-retry', onclick: (e) => bulkRetry(e.currentTarget) }, 'Retry failed…'),
        h('button', { class: 'ghost', id: 'bulk-cancel', onclick: (e) => bulkAction(e.currentTarget, 'cancel', 'queued', c.queued, 'Cancel') }, 'Cancel queued…'),
        h('button', { class: 'ghost', id: 'bulk-kill', onclick: (e) => bulkAction(e.currentTarget, 'kill', ['claimed', 'running'], c.running, 'Kill') }, 'Kill running…'));
    }
  };
  const bulkAction = (btn, verb, status, count, label) => act(btn, async () => {
    if (!count) { toast(`No ${Array.isArray(status) ? status.join(' or ') : status} tasks in ${q.name}.`); return; }
    if (!await confirmAction(`${label} about ${fmtN(count)} ${Array.isArray(status) ? 'running' : status} tasks of queue ${q.name}?`, label)) return;
    const r = await api('POST', `/api/v1/tasks/${verb}`, { filter: { queue: q.id, status: [].concat(status) }, reason: 'dashboard' });
    toast(verb === 'kill' ? `${fmtN(r.requested)} kill requests, ${fmtN(r.cancelled)} cancelled before start.` : `${fmtN(r.cancelled)} tasks cancelled.`);
    loadTasks(); loadQueue();
  });
  const bulkRetry = (btn) => act(btn, async () => {
    const filter = { queue: q.id, status: ['failed'] };
    const dry = await api('POST', '/api/v1/tasks/retry', { filter, dry_run: true });
    const n = dry.requeued + dry.reblocked;
    if (!n) { toast(`No failed tasks to retry in ${q.name}.`); return; }
    if (!await confirmAction(`Retry ${fmtN(n)} failed tasks of queue ${q.name}?`, 'Retry')) return;
    const r = await api('POST', '/api/v1/tasks/retry', { filter });
    toast(`${fmtN(r.requeued)} tasks queued again` + (r.reblocked ? `, ${fmtN(r.reblocked)} blocked for their parents.` : '.'));
    loadTasks(); loadQueue();
  });

  const drawSettings = () => {
    const ro = !can('write');
    const inp = (key, label, attrs) => h('label', {}, label, h('input', { name: key, type: 'number', value: q[key] ?? '', disabled: ro, ...attrs }));
    const form = h('form', { class: 'row', onsubmit: (e) => {
      e.preventDefault();
      const fd = new FormData(e.currentTarget), body = {};
      for (const k of ['maxthreads', 'max_running', 'priority', 'weight']) {
        const v = fd.get(k);
        if (v === '' || v === null) { if (k === 'maxthreads' && q.maxthreads !== null) body[k] = null; continue; }
        if (Number(v) !== q[k]) body[k] = Number(v);
      }
      const paused = fd.get('paused') === 'on';
      if (paused !== !!q.paused) body.paused = paused;
      if (!Object.keys(body).length) { toast('Nothing changed.'); return; }
      act(e.submitter, async () => { q = await api('PATCH', '/api/v1/queues/' + q.id, body); toast('Saved.'); drawHead(); drawSettings(); });
    } },
    inp('maxthreads', 'Max threads (per node)', { min: 0, placeholder: 'unlimited' }),
    inp('max_running', 'Max running (cluster)', { min: 0 }),
    inp('priority', 'Priority', { step: 'any' }),
    inp('weight', 'Weight', { step: 'any' }),
    h('label', { class: 'inline' }, h('input', { type: 'checkbox', name: 'paused', checked: q.paused, disabled: ro }), 'Paused'),
    ro ? null : h('button', { type: 'submit', id: 'save-queue' }, 'Save'));
    fill(settings, h('h2', { id: 'h-settings' }, 'Settings'), form,
      can('write') ? h('div', { class: 'row' },
        h('button', { class: 'ghost', id: 'pause', onclick: (e) => act(e.currentTarget, async () => {
          q = await api('PATCH', '/api/v1/queues/' + q.id, { paused: !q.paused }); toast(q.paused ? 'Paused.' : 'Resumed.'); drawHead(); drawSettings();
        }) }, q.paused ? 'Resume' : 'Pause'),
        h('button', { class: 'danger', onclick: (e) => act(e.currentTarget, async () => {
          const n = (q.counts && q.counts.total) || 0;
          if (!await confirmAction(`Delete queue ${q.name} and its ${fmtN(n)} tasks? This cannot be undone.`, 'Delete')) return;
          await api('DELETE', '/api/v1/queues/' + q.id + '?force=true');
          toast('Queue deleted.'); go('/');
        }) }, 'Delete queue…')) : null,
      h('dl', { class: 'kv' },
        h('dt', {}, 'Id'), h('dd', {}, q.id), h('dt', {}, 'Sort'), h('dd', {}, q.sort || 'fifo'),
        h('dt', {}, 'Timeout'), h('dd', {}, q.timeout ? q.timeout + ' s' : '–'), h('dt', {}, 'Retries'), h('dd', {}, q.retries ?? 0),
        h('dt', {}, 'Then'), h('dd', {}, q.then || '–'), h('dt', {}, 'Continuous'), h('dd', {}, q.continuous ? `every ${q.interval} s` : 'no'),
        h('dt', {}, 'Nodes pinned'), h('dd', {}, (q.nodes_pin || []).join(', ') || '–'),
        h('dt', {}, 'Config'), h('dd', {}, q.config ? JSON.stringify(q.config) : '–')));
  };
  // Re-read by its id once known: a rename keeps the page on the queue (and
  // the address follows its name), a delete says so.
  const loadQueue = throttle(async () => {
    try {
      q = await api('GET', '/api/v1/queues/' + (q ? q.id : encodeURIComponent(name)));
    } catch (e) {
      if (e.status === 404 && q && gen === pageGen) {
        fill(main, h('h1', {}, 'Queue ' + q.name), h('p', { class: 'errors', 'data-gone': '' }, 'This queue was deleted.'));
        q = null;
      }
      return;
    }
    if (gen !== pageGen) return;
    if (q.name !== name) {
      name = q.name;
      history.replaceState(history.state, '', '/ui/queues/' + encodeURIComponent(name) + location.search);
    }
    drawHead();
    if (!settings.firstChild || !settings.contains(document.activeElement)) drawSettings();
  }, 500);
  const gen = pageGen;
  (async () => {
    try { q = await api('GET', '/api/v1/queues/' + encodeURIComponent(name)); } catch (e) {
      if (gen === pageGen) fill(main, h('h1', {}, 'Queue ' + name), h('p', { class: 'errors' }, e.message));
      return;
    }
    drawHead(); drawSettings(); loadTasks.now();
  })();
  return page({
    onEvent(type, d) {
      if (!q) return;
      // A task event of an unknown queue (another program's write, before
      // pre-images are asked for) may be this queue's.
      const unknown = d.queue == null && d.from_queue == null;
      if (type === 'task' && (d.queue === q.id || d.from_queue === q.id || unknown)) { loadTasks(); loadQueue(); }
      if (type === 'queue' && d.id === q.id) loadQueue();
      if (type === 'reset') { loadTasks(); loadQueue(); }
    },
    // Counters are projections written after the events: re-read them
    // now and then even when no event says so.
    every: [[3000, () => q && loadQueue()]],
  });
}

// --------------------------------------------------------------- task page

// graphSVG draws a task graph left to right by depth (ancestors left of
// the task, descendants right); a depth with many tasks takes several
// columns of at most ROWS.
function graphSVG(g, self) {
  const byDepth = new Map();
  for (const t of g.tasks) { if (!byDepth.has(t.depth)) byDepth.set(t.depth, []); byDepth.get(t.depth).push(t); }
  const depths = [...byDepth.keys()].sort((a, b) => a - b);
  const W = 128, H = 26, GX = 36, GY = 8, ROWS = 12;
  const pos = new Map();
  let col = 0, rows = 0;
  for (const d of depths) {
    const list = byDepth.get(d);
    list.forEach((t, i) => pos.set(t.id, { x: 10 + (col + Math.floor(i / ROWS)) * (W + GX), y: 10 + (i % ROWS) * (H + GY) }));
    col += Math.ceil(list.length / ROWS);
    rows = Math.max(rows, Math.min(ROWS, list.length));
  }
  const width = 20 + col * (W + GX) - GX, height = 20 + rows * (H + GY) - GY;
  const edges = [], boxes = [];
  for (const t of g.tasks) {
    const p = pos.get(t.id);
    for (const parent of t.parents || []) {
      const q = pos.get(parent);
      if (q) edges.push(h('line', { x1: q.x + W, y1: q.y + H / 2, x2: p.x, y2: p.y + H / 2 }));
    }
    const name = t.status_name || statusName(t.status);
    boxes.push(h('svg:a', { href: '/ui/tasks/' + t.id, 'data-nav': true, 'data-graph-task': t.id, class: 's-' + name },
      h('title', {}, `${t.id} ${name}${t.reason ? ' (' + t.reason + ')' : ''}`),
      h('rect', { x: p.x, y: p.y, width: W, height: H, rx: 5, class: t.id === self ? 'self' : null, stroke: 'currentColor' }),
      h('text', { x: p.x + 6, y: p.y + 17 }, '…' + t.id.slice(-6) + ' ' + name)));
  }
  return h('svg', { class: 'graph', id: 'graph', viewBox: `0 0 ${width} ${height}`, width, height, role: 'img', 'aria-label': `task graph: ${g.tasks.length} tasks` }, edges, boxes);
}

function outputBlock(t, which) {
  const o = t[which];
  const url = `/api/v1/tasks/${t.id}/${which}`;
  const wrap = h('div', { id: 'out-' + which });
  if (!o) { wrap.append(h('p', { class: 'muted' }, 'none')); return wrap; }
  const pre = h('pre', { tabindex: 0, 'aria-label': which }, 'loading…');
  const links = h('div', { class: 'row' }, h('span', { class: 'muted' }, o.bytes === null ? 'missing GridFS file' : fmtN(o.bytes) + ' bytes' + (o.inline ? '' : ' in GridFS')),
    h('a', { href: url, target: '_blank', rel: 'noopener' }, 'open'), h('a', { href: url, download: `${t.id}.${which}.txt` }, 'download'));
  wrap.append(links, pre);
  // Streamed: the first 256 KiB are shown, however large the output.
  (async () => {
    const LIMIT = 256 << 10;
    try {
      const res = await fetch(url, { credentials: 'same-origin' });
      if (!res.ok) { pre.textContent = `(${res.status})`; return; }
      const reader = res.body.getReader(), dec = new TextDecoder();
      let text = '', n = 0;
      for (;;) {
        const { done, value } = await reader.read();
        if (done) break;
        n += value.length; text += dec.decode(value, { stream: true });
        if (n >= LIMIT) { reader.cancel(); text = text.slice(0, LIMIT) + `\n… ${fmtN((o.bytes || n) - LIMIT)} more bytes: open or download the whole output`; break; }
      }
      pre.textContent = text || '(empty)';
    } catch (e) { pre.textContent = 'could not read: ' + e.message; }
  })();
  return wrap;
}

// queueNames: ids to names, as far as this page has seen queues: what a
// task page shows until it has read its queue's name itself.
const queueNames = new Map();

function taskPage(id) {
  let t = null, lastStatus = null;
  // The queue's name as this page read it (a queue may be renamed: read
  // once a page, again on the queue's events; a failed read is not kept).
  // gen counts the queue's events: a read that began before one does not
  // count as read after it.
  let named = null, gen = 0, namedGen = -1;
  const mine = pageGen; // what this page draws after another replaced it is dropped
  const load = throttle(async () => {
    let nt;
    try { nt = await api('GET', '/api/v1/tasks/' + id); } catch (e) {
      if (mine === pageGen) fill(main, h('h1', {}, 'Task ' + id), h('p', { class: 'errors' }, e.message));
      return;
    }
    if (mine !== pageGen) return;
    const outputsChanged = !t || nt.status !== lastStatus || JSON.stringify(nt.stdout) !== JSON.stringify(t.stdout);
    if (named !== nt.queue || namedGen !== gen) {
      const g = gen;
      try {
        const name = (await api('GET', '/api/v1/queues/' + nt.queue)).name;
        if (g === gen) { queueNames.set(nt.queue, name); named = nt.queue; namedGen = g; }
      } catch { /* shown by id, read again next time */ }
      if (mine !== pageGen) return;
    }
    t = nt; lastStatus = t.status;
    draw(outputsChanged);
  }, 250);
  let outputs = null, graph = h('div', { id: 'graph-wrap' });
  const draw = (outputsChanged) => {
    const name = t.status_name || statusName(t.status);
    const actions = h('div', { class: 'row' });
    if (can('write')) {
      const btn = (label, verb, id) => h('button', { class: verb === 'retry' ? '' : 'danger', id, onclick: (e) => act(e.currentTarget, async () => {
        if (verb !== 'retry' && !await confirmAction(`${label} task ${t.id}?`, label)) return;
        const r = await api('POST', `/api/v1/tasks/${t.id}/${verb}`, {});
        const sk = (r.skipped || [])[0];
        toast(sk ? `${label}: ${sk.why}` : `${label}: done.`, !!sk);
        load();
      }) }, label);
      if ([-1, 0].includes(t.status)) actions.append(btn('Kill', 'kill', 'kill'));
      if ([-2, -4].includes(t.status)) actions.append(btn('Cancel', 'cancel', 'cancel'));
      if (t.status > 0 || [-3, -5, -6].includes(t.status)) actions.append(btn('Retry', 'retry', 'retry'));
    }
    if (CFG.jaeger) {
      const tags = encodeURIComponent(JSON.stringify({ 'disbatch.task.id': t.id }));
      actions.append(h('a', { class: 'button ghost', href: `${CFG.jaeger.replace(/\/$/, '')}/search?service=disbatchd&tags=${tags}`, target: '_blank', rel: 'noopener' }, 'Trace in Jaeger'));
    }
    const timeline = h('tbody');
    timeline.append(h('tr', {}, h('td', {}, 'created'), h('td', {}, fmtTime(t.ctime)), h('td', {}), h('td', {})));
    (t.attempts || []).forEach((a, i) => {
      timeline.append(h('tr', {}, h('td', {}, `attempt ${i + 1}`), h('td', {}, 'claimed ' + fmtTime(a.claimed)), h('td', {}, a.node || ''), h('td', {}, '')));
      if (a.started) timeline.append(h('tr', {}, h('td', {}), h('td', {}, 'started ' + fmtTime(a.started)), h('td', {}), h('td', {})));
      if (a.finished) timeline.append(h('tr', {}, h('td', {}), h('td', {}, 'finished ' + fmtTime(a.finished)), h('td', {}), h('td', {}, badge(statusName(a.status)), ' ', a.reason || '')));
    });
    if (t.kill) timeline.append(h('tr', {}, h('td', {}, 'kill asked'), h('td', {}, fmtTime(t.kill.at)), h('td', {}, t.kill.by || ''), h('td', {}, t.kill.reason || '')));
    if (t.cancel) timeline.append(h('tr', {}, h('td', {}, 'cancelled'), h('td', {}, fmtTime(t.cancel.at)), h('td', {}, t.cancel.by || ''), h('td', {}, t.cancel.reason || '')));
    timeline.append(h('tr', {}, h('td', {}, 'now'), h('td', {}, 'changed ' + fmtTime(t.mtime)), h('td', {}, t.node || ''), h('td', {}, badge(name), ' ', t.reason || '')));
    if (outputsChanged || !outputs) outputs = h('div', {}, h('h2', {}, 'stdout'), outputBlock(t, 'stdout'), h('h2', {}, 'stderr'), outputBlock(t, 'stderr'));
    fill(main, 
      h('h1', {}, 'Task ', h('code', {}, t.id), ' ', h('span', { id: 'task-status' }, badge(name))),
      h('div', { class: 'panel' },
        h('dl', { class: 'kv' },
          h('dt', {}, 'Queue'), h('dd', {}, h('a', { href: '/ui/queues/' + t.queue, 'data-nav': true, id: 'task-queue' }, queueNames.get(t.queue) || t.queue)),
          h('dt', {}, 'Node'), h('dd', {}, t.node || '–'), h('dt', {}, 'Reason'), h('dd', {}, t.reason || '–'),
          h('dt', {}, 'Priority'), h('dd', {}, t.priority ?? 0), h('dt', {}, 'Tries'), h('dd', {}, t.tries ?? 0),
          h('dt', {}, 'Timeout'), h('dd', {}, t.timeout ? t.timeout + ' s' : 'the queue\'s')),
        actions),
      h('h2', {}, 'Parameters'), h('pre', { id: 'params', tabindex: 0 }, JSON.stringify(t.params, null, 2)),
      h('h2', {}, 'Timeline'), h('div', { class: 'scroll panel' }, h('table', { id: 'timeline' }, timeline)),
      outputs,
      h('h2', {}, 'Graph'), graph);
  };
  const loadGraph = throttle(async () => {
    try {
      const g = await api('GET', `/api/v1/tasks/${id}/graph`);
      fill(graph, g.tasks.length > 1 ? h('div', { class: 'scroll panel' }, graphSVG(g, id)) : h('p', { class: 'muted' }, 'No parents and no children.'));
      if (g.truncated) graph.append(h('p', { class: 'muted' }, 'The graph is larger than shown.'));
    } catch (e) { fill(graph, h('p', { class: 'errors' }, e.message)); }
  }, 1000);
  load.now(); loadGraph.now();
  return page({
    onEvent(type, d) {
      if (type === 'task' && d.id === id) load();
      if (type === 'queue' && t && d.id === t.queue) { gen++; load(); }
      if (type === 'task' && graph.querySelector(`[data-graph-task="${d.id}"]`)) loadGraph();
      if (type === 'reset') { gen++; load(); loadGraph(); }
    },
  });
}

// -------------------------------------------------------------- nodes page

// wakeups says how a node hears of new tasks, from its heartbeat: by its
// change stream or by polling alone, which queues it serves (including
// those a pause or maxthreads 0 holds for now), and which of them it has
// no free slot for. A dead node's is its last heartbeat's.
function wakeups(n) {
  if (n.wakeup_stream === null || n.wakeup_stream === undefined) return 'Wake-ups: not reported (Disbatch 4.103, or an earlier version of this node).';
  const names = new Map((n.queues || []).map((q) => [q.id, q.name]));
  const list = (ids) => (ids || []).map((id) => names.get(id) || id).join(', ') || 'none';
  return `Wake-ups${n.dead ? ' (at its last heartbeat)' : ''}: ${n.wakeup_stream ? 'change stream' : 'polling only (--poll-only)'}; serves: ${list(n.serves)}; full: ${list(n.full)}.`;
}

function nodesPage() {
  let nodes = [];
  const body = h('div');
  fill(main, h('h1', {}, 'Nodes'), body);
  const draw = async () => {
    const running = await api('GET', '/api/v1/tasks?status=claimed&status=running&limit=1000&order=asc');
    const byNode = new Map();
    for (const t of running.tasks) { if (!byNode.has(t.node)) byNode.set(t.node, []); byNode.get(t.node).push(t); }
    if (document.activeElement && body.contains(document.activeElement) && document.activeElement.tagName === 'INPUT') return;
    fill(body, ...(nodes.length ? nodes.map((n) => {
      const st = nodeState(n), tasks = byNode.get(n.node) || [];
      const mt = h('input', { type: 'number', min: 0, value: n.maxthreads ?? '', placeholder: '∞', 'aria-label': `maxthreads of ${n.node}`, disabled: !can('admin') });
      return h('section', { class: 'panel', 'data-node': n.node },
        h('h2', {}, n.node, ' ', badge(st), ' ', h('span', { class: 'muted' }, 'heartbeat ' + fmtAge(n.heartbeat_age_ms) + ' ago')),
        can('admin') ? h('div', { class: 'row' },
          h('label', {}, 'Max threads', mt),
          h('button', { class: 'ghost', onclick: (e) => act(e.currentTarget, async () => {
            await api('PATCH', '/api/v1/nodes/' + encodeURIComponent(n.node), { maxthreads: mt.value === '' ? null : Number(mt.value) });
            toast(`maxthreads of ${n.node} set.`); load.now();
          }) }, 'Set'),
          n.drain ? null : h('button', { class: 'danger', onclick: (e) => act(e.currentTarget, async () => {
            if (!await confirmAction(`Drain ${n.node}? It finishes its running tasks and claims no more.`, 'Drain')) return;
            await api('POST', '/api/v1/nodes/' + encodeURIComponent(n.node) + '/drain', {});
            toast(`${n.node} is draining.`); load.now();
          }) }, 'Drain…')) : null,
        h('p', { class: 'muted' }, `${nodeRunning(n)} running of ${n.maxthreads ?? '∞'}; queues: `,
          (n.queues || []).map((q) => `${q.name} (${q.tasks_doing})`).join(', ') || 'none'),
        h('p', { class: 'muted', 'data-wakeups': '', title: 'A queue\'s new tasks wake the first few nodes (disbatchd --wakeup-listeners, 3 by default) among those that serve it with a change stream; nodes with no free slot for it rank last. The others find its tasks by their 1-second tick.' }, wakeups(n)),
        tasks.length ? h('div', { class: 'scroll' }, h('table', {}, h('tbody', {}, tasks.map(taskRow)))) : null,
        // One read lists the cluster's first 1,000 claimed or running
        // tasks: a node whose tasks lie beyond them says so rather than
        // "no tasks".
        tasks.length < nodeRunning(n) && running.next ? h('p', { class: 'muted', 'data-beyond': '' },
          `${fmtN(nodeRunning(n) - tasks.length)} more running here, beyond the cluster's first 1,000 listed on this page.`) : null,
        !tasks.length && !(nodeRunning(n) && running.next) ? h('p', { class: 'muted' }, 'No tasks running.') : null);
    }) : [h('p', { class: 'muted' }, 'No node has written a heartbeat.')]));
  };
  const load = throttle(async () => { nodes = (await api('GET', '/api/v1/nodes')).nodes; await draw(); }, 500);
  load.now();
  return page({
    onEvent(type, d) { if (type === 'node' || type === 'reset' || (type === 'task' && (d.to === 0 || d.from === 0))) load(); },
    every: [[5000, () => load()]],
  });
}

// ------------------------------------------------------------- submit page

function submitPage() {
  const queue = h('select', { id: 'submit-queue', name: 'queue', required: true });
  const text = h('textarea', { id: 'submit-lines', 'aria-label': 'Tasks, one JSON object per line', spellcheck: false,
    placeholder: '{"params": {"commands": "echo hello"}}\n{"params": {"n": 2}, "priority": 5}\n{"ref": "a", "params": {}}\n{"params": {}, "parents": ["a"]}' });
  const out = h('div', { id: 'submit-result', 'aria-live': 'polite' });
  const disabled = !can('write');
  fill(main, h('h1', {}, 'Submit tasks'),
    h('p', { class: 'muted' }, 'One task per line, as the v1 API takes it: {"params": {...}} with optional timeout, priority, not_before, expires_at, ref and parents (a graph). A bare object without "params" is taken as the parameters. Every line is checked before anything is inserted.'),
    h('form', { class: 'panel', onsubmit: (e) => { e.preventDefault(); submit(e.submitter); } },
      h('div', { class: 'row' }, h('label', {}, 'Queue', queue)), text,
      h('div', { class: 'row' }, h('button', { type: 'button', class: 'ghost', onclick: () => check() }, 'Check'),
        h('button', { type: 'submit', disabled }, 'Submit'), disabled ? h('span', { class: 'muted' }, 'Your role cannot submit.') : null)),
    out);
  api('GET', '/api/v1/queues').then((r) => {
    fill(queue, ...r.queues.map((q) => h('option', { value: q.name }, q.name)));
  }).catch((e) => toast(e.message, true));
  // parse returns {tasks, lines (task index → line number), errors}.
  const parse = () => {
    const tasks = [], lines = [], errors = [];
    text.value.split('\n').forEach((raw, i) => {
      const s = raw.trim();
      if (!s) return;
      let v;
      try { v = JSON.parse(s); } catch (e) { errors.push([i + 1, e.message]); return; }
      if (!v || typeof v !== 'object' || Array.isArray(v)) { errors.push([i + 1, 'want a JSON object']); return; }
      if (!('params' in v)) v = { params: v };
      if (!v.params || typeof v.params !== 'object' || Array.isArray(v.params)) { errors.push([i + 1, '"params" must be an object']); return; }
      tasks.push(v); lines.push(i + 1);
    });
    if (!tasks.length && !errors.length) errors.push([0, 'no tasks: write one JSON object per line']);
    return { tasks, lines, errors };
  };
  const show = (errors, ok) => {
    fill(out, errors.length ? h('div', { class: 'panel' }, h('strong', {}, `${errors.length} error${errors.length > 1 ? 's' : ''}; nothing was inserted`),
      h('ul', { class: 'errors', id: 'submit-errors' }, errors.map(([n, m]) => h('li', { 'data-line': n }, n ? `line ${n}: ${m}` : m)))) : ok);
  };
  const check = () => {
    const p = parse();
    show(p.errors, h('p', {}, `${p.tasks.length} tasks look right.`));
    return p;
  };
  const submit = (btn) => act(btn, async () => {
    const p = check();
    if (p.errors.length) return;
    try {
      const r = await api('POST', '/api/v1/tasks', { queue: queue.value, tasks: p.tasks });
      show([], h('div', { class: 'panel' }, h('p', {}, `${r.ids.length} tasks inserted into ${queue.value}.`),
        h('ul', {}, r.ids.slice(0, 20).map((id) => h('li', {}, h('a', { href: '/ui/tasks/' + id, 'data-nav': true }, id)))),
        r.ids.length > 20 ? h('p', { class: 'muted' }, `and ${r.ids.length - 20} more`) : null));
    } catch (e) {
      // The API names the field: tasks[3].params → the line of task 3.
      const m = /^tasks\[(\d+)\]/.exec(e.field || '');
      show([[m ? p.lines[Number(m[1])] : 0, e.message]]);
    }
  });
  return page({});
}

// ------------------------------------------------------------ balance page

function balancePage() {
  let doc = null;
  const body = h('div');
  fill(main, h('h1', {}, 'QueueBalancer settings'),
    h('p', { class: 'muted' }, '4.103\'s QueueBalance: caps the running tasks of groups of queues by day of the week (0 Sunday … 6, * every day) and time of day. Saved to the balance document through POST /balance.'), body);
  const draw = () => {
    const ro = !can('admin');
    const caps = h('tbody'), groups = h('div');
    const capRow = (k, v) => h('tr', {},
      h('td', {}, h('input', { class: 'cap-key', value: k, placeholder: '* 08:00', 'aria-label': 'day and time', disabled: ro, size: 9 })),
      h('td', {}, h('input', { class: 'cap-val', type: 'number', min: 0, value: v, 'aria-label': 'max tasks', disabled: ro })),
      h('td', {}, ro ? null : h('button', { type: 'button', class: 'ghost', onclick: (e) => e.currentTarget.closest('tr').remove() }, 'Remove')));
    const groupRow = (names) => h('div', { class: 'row' }, h('input', { class: 'group', value: names.join(', '), list: 'known-queues', size: 50, 'aria-label': 'queues of a group, comma-separated', disabled: ro }),
      ro ? null : h('button', { type: 'button', class: 'ghost', onclick: (e) => e.currentTarget.parentElement.remove() }, 'Remove'));
    for (const [k, v] of Object.entries(doc.max_tasks || {}).sort()) caps.append(capRow(k, v));
    for (const g of doc.queues || []) groups.append(groupRow(g));
    const disabledUntil = h('input', { id: 'balance-disabled', type: 'number', min: 0, value: doc.disabled ?? '', placeholder: 'epoch seconds', disabled: ro });
    fill(body, 
      doc.notice ? h('p', { class: 'muted' }, doc.notice) : null,
      doc.status ? h('p', {}, 'queuebalanced: ', badge(String(doc.status).toLowerCase(), doc.status), ' ', doc.message || '') : null,
      h('datalist', { id: 'known-queues' }, (doc.known_queues || []).map((n) => h('option', { value: n }))),
      h('form', { class: 'panel', id: 'balance-form', onsubmit: (e) => { e.preventDefault(); save(e.submitter, caps, groups, disabledUntil, msg); } },
        h('h2', {}, 'Caps (max tasks)'), h('table', {}, caps),
        ro ? null : h('button', { type: 'button', class: 'ghost', onclick: () => caps.append(capRow('', '')) }, 'Add a cap'),
        h('h2', {}, 'Queue groups'), groups,
        ro ? null : h('button', { type: 'button', class: 'ghost', onclick: () => groups.append(groupRow([])) }, 'Add a group'),
        h('h2', {}, 'Disabled until'), disabledUntil,
        h('div', { class: 'row end' }, ro ? h('span', { class: 'muted' }, 'Only an admin can change the balance.') : h('button', { type: 'submit' }, 'Save'))),
      msg);
  };
  const msg = h('div', { id: 'balance-result', 'aria-live': 'polite' }); // outlives a redraw
  const save = (btn, caps, groups, disabledUntil, msg) => act(btn, async () => {
    const body = { max_tasks: {}, queues: [] };
    for (const tr of caps.querySelectorAll('tr')) {
      const k = tr.querySelector('.cap-key').value.trim(), v = tr.querySelector('.cap-val').value;
      if (k) body.max_tasks[k] = String(v === '' ? 0 : v);
    }
    for (const inp of groups.querySelectorAll('.group')) {
      const names = inp.value.split(',').map((s) => s.trim()).filter(Boolean);
      if (names.length) body.queues.push(names);
    }
    if (disabledUntil.value !== '') body.disabled = String(disabledUntil.value);
    try {
      const r = await api('POST', '/balance', body);
      fill(msg, h('p', {}, r.status));
      await load();
    } catch (e) {
      fill(msg, h('p', { class: 'errors' }, e.message));
    }
  });
  const load = async () => {
    const res = await fetch('/balance', { headers: { Accept: 'application/json' }, credentials: 'same-origin' });
    doc = await res.json();
    if (!res.ok) throw new APIError(res.status, doc);
    draw();
  };
  load().catch((e) => fill(body, h('p', { class: 'errors' }, e.message)));
  return page({});
}

// ------------------------------------------------------------------- start

(function start() {
  const saved = localStorage.getItem('disbatch-theme');
  if (saved) document.documentElement.dataset.theme = saved;
  document.getElementById('theme').addEventListener('click', () => {
    const dark = document.documentElement.dataset.theme ? document.documentElement.dataset.theme === 'dark' : matchMedia('(prefers-color-scheme: dark)').matches;
    const next = dark ? 'light' : 'dark';
    document.documentElement.dataset.theme = next;
    localStorage.setItem('disbatch-theme', next);
  });
  document.getElementById('who').textContent = CFG.auth ? `${CFG.user} (${CFG.role})` : '';
  document.body.dataset.role = CFG.role;
  live.start();
  render();
})();
