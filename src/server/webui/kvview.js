// The live view of the KV memory: polls GET /v1/kv/state (the engine's own counters) and draws
// the pool's blocks by state, each tier, the prefix cache, the page actions (rates are the
// differences of the engine's counters between two polls, over the server's clock) with their
// predicted and measured bring-back times, and the current conversation's pages by where they
// live. Nothing here is estimated in the page.

import {authHeaders} from './chat_client.js';

const kPollMs = 500;
const kMaxGridCells = 1024;  // beyond this, one cell stands for several blocks
const kPoolStates = [
  ['in_use', 'in use'], ['compressed', 'compressed'], ['cached', 'cached'], ['free', 'free']];
const kPageLocations = ['pool', 'compressed', 'ram', 'disk', 'redis', 'checkpointed', 'evicted',
                        'dropped'];

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

export function formatBytes(n) {
  if (!Number.isFinite(n)) return '-';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    ++i;
  }
  return `${n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}

function formatMs(ms) {
  if (!Number.isFinite(ms) || ms <= 0) return '-';
  if (ms < 1) return `${(ms * 1000).toFixed(ms < 0.01 ? 1 : 0)} µs`;
  return ms >= 100 ? `${ms.toFixed(0)} ms` : `${ms.toFixed(1)} ms`;
}

// Sets a figure's text and its raw value (data-value, read by the browser tests).
function setFigure(id, text, value) {
  const node = document.getElementById(id);
  node.textContent = text;
  node.dataset.value = String(value);
}

function legend(list, entries) {
  list.replaceChildren(...entries.map(([cls, label]) => {
    const li = el('li');
    li.append(el('span', `swatch ${cls}`), document.createTextNode(label));
    return li;
  }));
}

export class KvView {
  // `getApiKey()` returns the key to send; `onError(message)` reports a failed poll.
  constructor({getApiKey, onError}) {
    this.getApiKey = getApiKey;
    this.onError = onError;
    this.previous = null;  // the last state, for rates
    this.state = null;
    this.tracked = null;   // {conversationId, firstRequest}: a reply of ours is on its way
    this.lastMaps = new Map();  // conversation id -> its last page map seen
    this.conversationId = null;
    this.timer = null;
    this.gridCells = [];
  }

  start() {
    const tick = async () => {
      if (!document.hidden) await this.poll();
      this.timer = setTimeout(tick, kPollMs);
    };
    tick();
  }

  // The page shows `conversationId`'s pages.
  setConversation(conversationId) {
    this.conversationId = conversationId;
    if (this.state) this.renderSequence();
  }
  // A reply of ours is about to be sent: until the server names its request (X-Request-Id), the
  // first one numbered past the count read now stands for it.
  async replyStarted(conversationId) {
    await this.poll();
    this.tracked = {conversationId, firstRequest: (this.state?.requests.submitted ?? 0) + 1};
  }
  // The server named the reply's request: only its pages are shown, whatever other clients send.
  followRequest(conversationId, requestId) {
    this.tracked = {conversationId, request: requestId};
  }
  async replyEnded() {
    await this.poll();  // its map as its last step left it (the engine keeps the last 16 ended)
    this.tracked = null;
    if (this.state) this.renderSequence();
  }

  async poll() {
    try {
      const response = await fetch('/v1/kv/state', {headers: authHeaders(this.getApiKey())});
      if (!response.ok) {
        const body = await response.json().catch(() => ({}));
        throw new Error(body.error?.message ?? `HTTP ${response.status}`);
      }
      this.previous = this.state;
      this.state = await response.json();
      this.render();
      document.getElementById('kv-live').textContent = '(live)';
    } catch (e) {
      document.getElementById('kv-live').textContent = `(unavailable: ${e.message})`;
      this.onError?.(`KV state: ${e.message}`);
    }
  }

  render() {
    this.renderPool();
    this.renderPrefix();
    this.renderTiers();
    this.renderActions();
    this.trackSequence();
    this.renderSequence();
  }

  renderPool() {
    const pool = this.state.pool;
    const counts = {in_use: pool.blocks_in_use, compressed: pool.blocks_compressed,
                    cached: pool.blocks_cached, free: pool.blocks_free};
    const total = Math.max(1, pool.blocks_total);
    const bar = document.getElementById('kv-pool-bar');
    if (bar.childElementCount === 0) {
      for (const [state] of kPoolStates) bar.append(el('span', `seg ${state}`));
    }
    kPoolStates.forEach(([state], i) => {
      bar.children[i].style.width = `${(100 * counts[state]) / total}%`;
    });
    bar.setAttribute('aria-label', kPoolStates.map(([s, label]) => `${counts[s]} ${label}`).join(', '));
    legend(document.getElementById('kv-pool-legend'), [
      ...kPoolStates.map(([s, label]) => [s, `${label} ${counts[s]}`]),
      ['none', `${formatBytes(pool.bytes_used)} / ${formatBytes(pool.bytes_capacity)} ` +
                   `(${pool.block_tokens} tokens a block)`]]);
    for (const [s] of kPoolStates) {
      document.getElementById('kv-pool-legend').dataset[s] = String(counts[s]);
    }
    // The grid: one cell per block (or per group of blocks), in use first, then compressed,
    // cached and free, so that the picture reads as the bar does.
    const grid = document.getElementById('kv-pool-grid');
    const cells = Math.min(total, kMaxGridCells);
    if (this.gridCells.length !== cells) {
      this.gridCells = Array.from({length: cells}, () => el('span', 'cell'));
      grid.replaceChildren(...this.gridCells);
    }
    const perCell = total / cells;
    let next = 0;
    for (const [state] of kPoolStates) {
      const end = Math.min(cells, Math.round((next * perCell + counts[state]) / perCell));
      for (; next < end; ++next) this.gridCells[next].className = `cell ${state}`;
    }
    for (; next < cells; ++next) this.gridCells[next].className = 'cell free';
    grid.title = perCell > 1 ? `one cell: ${perCell.toFixed(1)} blocks` : 'one cell: one block';
  }

  renderPrefix() {
    const {prefix, requests, tiers} = this.state;
    // Hits in the pool and in every tier of the KV store, over the prompt tokens looked up.
    const tierHits = tiers.reduce((sum, t) => sum + t.hit_tokens, 0);
    const hits = prefix.hit_tokens + tierHits;
    const rate = prefix.query_tokens > 0 ? hits / prefix.query_tokens : 0;
    setFigure('kv-hit-rate', prefix.query_tokens > 0 ? `${(100 * rate).toFixed(1)} %` : '-', rate);
    setFigure('kv-hit-tokens', String(hits), hits);
    setFigure('kv-query-tokens', `${prefix.query_tokens} tokens in ${prefix.queries} lookups`,
              prefix.query_tokens);
    setFigure('kv-requests',
              `${requests.running} running, ${requests.waiting} waiting, ${requests.finished} done`,
              requests.finished);
  }

  renderTiers() {
    const body = document.querySelector('#kv-tiers tbody');
    if (this.state.tiers.length === 0) {
      const row = el('tr');
      const cell = el('td', 'muted', 'pool only (start kvl serve with --kv-tier ram:auto to add one)');
      cell.colSpan = 5;
      row.append(cell);
      body.replaceChildren(row);
      return;
    }
    body.replaceChildren(...this.state.tiers.map((t) => {
      const row = el('tr');
      row.append(el('td', '', t.name),
                 el('td', '', `${formatBytes(t.bytes_used)} / ${formatBytes(t.bytes_capacity)}`),
                 el('td', '', String(t.pages_in)), el('td', '', String(t.pages_out)),
                 el('td', '', `${t.hit_blocks} blocks`));
      return row;
    }));
  }

  renderActions() {
    const {actions, time_ms: now} = this.state;
    const before = this.previous;
    const seconds = before ? (now - before.time_ms) / 1000 : 0;
    const body = document.querySelector('#kv-actions tbody');
    body.replaceChildren(...Object.entries(actions).map(([name, a]) => {
      const rate = seconds > 0 ? (a.pages - (before.actions[name]?.pages ?? 0)) / seconds : 0;
      const row = el('tr');
      row.dataset.action = name;
      // Bring-back time a page: what the cost model predicted when pages left, against what
      // the pages brought back took; the median error is per page, over the last 4096.
      const measured = a.pages_restored > 0 ? formatMs(a.measured_ms / a.pages_restored) : '-';
      const error = a.error.samples > 0 ? ` ±${a.error.median_pct.toFixed(0)}%` : '';
      const cell = el('td', '', `${measured}${error}`);
      if (error) cell.title = `median error over ${a.error.samples} pages`;
      row.append(el('td', '', name), el('td', '', String(a.pages)),
                 el('td', '', rate > 0 ? rate.toFixed(1) : '0'),
                 el('td', '', String(a.pages_restored)),
                 el('td', '', a.pages > 0 ? formatMs(a.predicted_ms / a.pages) : '-'), cell);
      return row;
    }));
  }

  // While a reply of ours runs, and just after, its request's page map (running, or among the
  // last ended) is kept for the conversation.
  trackSequence() {
    if (!this.tracked) return;
    const {firstRequest, request, conversationId} = this.tracked;
    const ours = (s) => (request !== undefined ? s.request === request : s.request >= firstRequest);
    const running = this.state.sequences.filter(ours);
    const ended = this.state.sequences_ended.filter(ours);
    const all = [...running.map((s) => ({...s, live: true})), ...ended.map((s) => ({...s, live: false}))];
    if (all.length === 0) return;
    this.lastMaps.set(conversationId, all.reduce((a, b) => (b.request < a.request ? b : a)));
  }

  renderSequence() {
    const map = this.lastMaps.get(this.conversationId);
    const grid = document.getElementById('kv-seq-pages');
    const caption = document.getElementById('kv-seq-caption');
    if (!map) {
      grid.replaceChildren();
      caption.textContent = 'Send a message: its request\'s pages show here while it runs.';
      grid.dataset.pages = '0';
      return;
    }
    const live = map.live && this.tracked?.conversationId === this.conversationId;
    const pages = map.pages.length === 1 ? 'page' : 'pages';
    caption.textContent = `request ${map.request}: ${map.tokens} tokens in ${map.pages.length} ` +
                          `${pages}, ${map.cached_prompt_tokens} prompt tokens from the cache` +
                          (live ? ' (live)' : ' (at its last step)');
    grid.replaceChildren(...map.pages.map((where, i) => {
      const cell = el('span', `cell page-${where}`);
      cell.title = `page ${i}: ${where}`;
      return cell;
    }));
    grid.dataset.pages = String(map.pages.length);
    const seen = kPageLocations.filter((w) => map.pages.includes(w));
    legend(document.getElementById('kv-seq-legend'),
           seen.map((w) => [`page-${w}`, `${w} ${map.pages.filter((p) => p === w).length}`]));
  }
}
