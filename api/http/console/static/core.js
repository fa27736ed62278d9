/* zfab console, the core every page loads first: elements, formatting, messages, the API (with the
 * caller's bearer token), periodic readings, event streams, signing in. The view scripts after it find
 * all this in window.zfab and register themselves in window.zfab.views; the page's view starts once the
 * document is parsed (every script is `defer`, so they have all run by then).
 *
 * Every datum comes from the API with the caller's bearer token (kept in this tab's sessionStorage, sent
 * only as the Authorization header). Text from jobs is always set as text, never as HTML.
 */
(() => {
  'use strict';

  const body = document.body;
  const ROOT = body.dataset.root || '';
  const VIEW = body.dataset.view;
  const TOKEN_KEY = 'zfab.token';
  const PAGE_SIZE = 50;
  const STATES = ['queued', 'running', 'waiting', 'completed', 'failed', 'cancelled', 'expired', 'lost'];
  const FINAL = new Set(['completed', 'failed', 'cancelled', 'expired', 'lost']);

  const $ = (sel, el) => (el || document).querySelector(sel);
  const $$ = (sel, el) => Array.from((el || document).querySelectorAll(sel));
  const enc = encodeURIComponent;
  const sleep = (ms) => new Promise((done) => setTimeout(done, ms));
  const now = () => Date.now() / 1000;

  /** An element: h('td', {class: 'num'}, 'text', child, ...). Strings become text nodes, never HTML. */
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat()) {
      if (kid === null || kid === undefined || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }

  // ---- formatting ---------------------------------------------------------------------------------

  const pad = (n, w = 2) => String(n).padStart(w, '0');
  /** Epoch seconds of an ISO time, to the microsecond (Date.parse stops at the millisecond). */
  function epochOf(iso) {
    if (!iso) return null;
    const frac = /\.(\d+)/.exec(iso);
    return Date.parse(iso.replace(/\.\d+/, '')) / 1000 + (frac ? Number(`0.${frac[1]}`) : 0);
  }

  function fmtTime(t, ms) {
    if (t === null || t === undefined) return '–';
    const d = new Date(t * 1000);
    const today = new Date();
    let s = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
    if (ms) s += '.' + pad(d.getMilliseconds(), 3);
    if (d.toDateString() !== today.toDateString()) s = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${s}`;
    return s;
  }

  function fmtDur(s) {
    if (s === null || s === undefined || !isFinite(s)) return '–';
    if (s < 0) s = 0;
    if (s < 0.0009995) return `${Math.round(s * 1e6)} µs`;
    if (s < 0.9995) { const ms = s * 1000; return `${ms.toFixed(ms < 9.995 ? 2 : ms < 99.95 ? 1 : 0)} ms`; }
    if (s < 59.95) return `${s.toFixed(s < 9.995 ? 2 : 1)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} m ${pad(Math.floor(s % 60))} s`;
    if (s < 86400) return `${Math.floor(s / 3600)} h ${pad(Math.floor((s % 3600) / 60))} m`;
    return `${Math.floor(s / 86400)} d ${Math.floor((s % 86400) / 3600)} h`;
  }

  /** Time left, in whole seconds (a countdown ticks once a second). */
  function fmtLeft(s) {
    const n = Math.max(0, Math.ceil(s));
    return n < 60 ? `${n} s` : n < 3600 ? `${Math.floor(n / 60)} m ${pad(n % 60)} s` : fmtDur(n);
  }

  function fmtBytes(n) {
    if (typeof n !== 'number') return '–';
    const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < units.length - 1) { n /= 1024; i += 1; }
    return `${i ? n.toFixed(n < 10 ? 1 : 0) : n} ${units[i]}`;
  }

  /** A schedule's period: whole minutes and hours as such, anything else as a duration. */
  function fmtEvery(s) {
    if (!Number.isInteger(s)) return fmtDur(s);
    if (s % 3600 === 0) return `${s / 3600} h`;
    if (s % 60 === 0) return `${s / 60} min`;
    return `${s} s`;
  }

  const fmtNum = (n) => (typeof n === 'number' ? n.toLocaleString('en-US') : '–');
  const badge = (state) => h('span', { class: `badge st-${state}` }, state);
  const pretty = (v) => JSON.stringify(v, null, 2);
  const target = (w) => (Array.isArray(w) ? w.join(', ') : String(w));
  const jobLink = (uuid, text) => h('a', { href: `${ROOT}/ui/jobs/${enc(uuid)}`, class: 'mono' }, text || uuid);

  /** A cell that counts up from `since` (epoch seconds) while the page is open. */
  const ticking = (since) => h('td', { class: 'num', dataset: { since: String(since) } }, fmtDur(now() - since));
  function tick() {
    for (const el of $$('[data-since]')) el.textContent = fmtDur(now() - Number(el.dataset.since));
    // An input's deadline: the API says how many seconds were left when it answered (its own clock), and
    // the page counts down on the browser's clock from its receipt of that answer (data-deadline).
    for (const el of $$('[data-deadline]')) {
      const left = Number(el.dataset.deadline) - now();
      el.textContent = left > 0 ? `${fmtLeft(left)} left` : 'time is up';
      el.classList.toggle('late', left <= 0);
    }
    for (const el of $$('[data-until]')) {
      const left = Number(el.dataset.until) - now();
      el.textContent = left > 0 ? `in ${fmtDur(left)}` : 'due';
    }
  }

  // ---- messages -----------------------------------------------------------------------------------

  const flashEl = $('#flash');
  let flashTimer = 0;
  let flashFrom = null;

  function flash(message, { ok = false, from = null } = {}) {
    clearTimeout(flashTimer);
    flashEl.replaceChildren(...[message].flat());
    flashEl.classList.toggle('ok', ok);
    flashEl.hidden = false;
    flashFrom = from;
    if (ok) flashTimer = setTimeout(() => { flashEl.hidden = true; }, 6000);
  }

  function unflash(from) {
    if (from !== null && flashFrom === from) flashEl.hidden = true;
  }

  function report(err, from) {
    if (err && err.status === 401) return; // the sign-in form is up
    flash(err && err.message ? `${err.message}${err.status ? ` (${err.status})` : ''}` : String(err), { from });
  }

  // ---- the API ------------------------------------------------------------------------------------

  class ApiError extends Error {
    constructor(status, problem) {
      super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
      this.status = status;
      this.problem = problem || {};
    }
  }

  function headers(extra) {
    const out = Object.assign({}, extra);
    const token = sessionStorage.getItem(TOKEN_KEY);
    if (token) out.Authorization = `Bearer ${token}`;
    return out;
  }

  async function problemOf(r) {
    try { return await r.json(); } catch (e) { return { detail: r.statusText || `HTTP ${r.status}` }; }
  }

  async function api(path, { method = 'GET', body: data, signal } = {}) {
    const hd = headers({ Accept: 'application/json' });
    let payload;
    if (data !== undefined) {
      payload = JSON.stringify(data);
      hd['Content-Type'] = 'application/json';
    }
    const r = await fetch(ROOT + path, { method, headers: hd, body: payload, signal, cache: 'no-store', credentials: 'omit' });
    if (r.status === 401) signIn();
    if (!r.ok) throw new ApiError(r.status, await problemOf(r));
    return r.status === 204 ? null : r.json();
  }

  /**
   * Run `fn` now and every `ms` while the tab is visible; errors are shown, and cleared by a success.
   * A reading that took the API long (a filter over a large table) spaces the next ones out: never
   * less than ten times its own duration, so one open console takes at most a tenth of the API's time.
   */
  function every(ms, fn) {
    let timer = 0;
    let running = false;
    let again = false; // now() was asked during a reading: one more follows it at once
    let stopped = false;
    const key = {};
    const run = async () => {
      timer = 0;
      if (stopped) return;
      let wait = ms;
      if (!document.hidden) {
        running = true;
        const started = performance.now();
        try { await fn(); unflash(key); } catch (e) { report(e, key); }
        running = false;
        wait = again ? 0 : Math.max(ms, 10 * (performance.now() - started));
        again = false;
      }
      if (!stopped) timer = setTimeout(run, wait);
    };
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && timer) { clearTimeout(timer); run(); }
    });
    run();
    return {
      stop() { stopped = true; clearTimeout(timer); },
      now() {
        if (running) again = true;
        else if (timer) { clearTimeout(timer); run(); }
      },
    };
  }

  /**
   * Read a server-sent event stream with fetch(), which can send the Authorization header (an
   * EventSource cannot). Calls onMessage({id, event, data}); true once the stream said `end`.
   */
  async function readStream(path, lastId, onMessage, signal) {
    const hd = headers({ Accept: 'text/event-stream' });
    if (lastId) hd['Last-Event-ID'] = lastId;
    const r = await fetch(ROOT + path, { headers: hd, signal, cache: 'no-store', credentials: 'omit' });
    if (r.status === 204) return true;
    if (r.status === 401) signIn();
    if (!r.ok) throw new ApiError(r.status, await problemOf(r));
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let buffer = '';
    let ended = false;
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, '\n');
      let cut;
      while ((cut = buffer.indexOf('\n\n')) >= 0) {
        const block = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const msg = { id: null, event: 'message', data: [] };
        for (const line of block.split('\n')) {
          if (!line || line[0] === ':') continue; // a comment: the server's ping
          const i = line.indexOf(':');
          const field = i < 0 ? line : line.slice(0, i);
          let val = i < 0 ? '' : line.slice(i + 1);
          if (val[0] === ' ') val = val.slice(1);
          if (field === 'data') msg.data.push(val);
          else if (field === 'id') msg.id = val;
          else if (field === 'event') msg.event = val;
        }
        if (!msg.data.length) continue;
        msg.data = msg.data.join('\n');
        if (msg.event === 'end') ended = true;
        onMessage(msg);
      }
    }
    return ended;
  }

  /** Follow a job's events until its end, resuming after the last id when the stream breaks. */
  async function follow(uuid, onEvent, onEnd) {
    let last = '0';
    let pause = 500;
    for (;;) {
      try {
        const ended = await readStream(`/jobs/${enc(uuid)}/events`, last, (m) => {
          if (m.event === 'end') { onEnd(JSON.parse(m.data)); return; }
          if (m.id) last = m.id;
          onEvent(JSON.parse(m.data), Number(m.id));
        });
        if (ended) return;
        pause = 500;
      } catch (e) {
        if ([401, 403, 404].includes(e.status)) return;
      }
      await sleep(pause);
      pause = Math.min(pause * 2, 5000);
    }
  }

  // ---- signing in ---------------------------------------------------------------------------------

  function signIn() {
    const overlay = $('#login');
    if (!overlay.hidden) return;
    overlay.hidden = false;
    const had = sessionStorage.getItem(TOKEN_KEY);
    $('#login-error').textContent = had ? 'The token this tab had is not accepted any more.' : '';
    $('#token').focus();
  }

  $('#login-form').addEventListener('submit', async (ev) => {
    ev.preventDefault();
    const token = $('#token').value.trim();
    if (!token) return;
    let r;
    try {
      r = await fetch(`${ROOT}/jobs?limit=1`, { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
    } catch (e) {
      $('#login-error').textContent = `The API does not answer (${e.message}).`;
      return;
    }
    if (r.status === 401) {
      $('#login-error').textContent = 'This token is not accepted.';
      return;
    }
    sessionStorage.setItem(TOKEN_KEY, token);
    location.reload();
  });

  const signOut = $('#signout');
  signOut.hidden = !sessionStorage.getItem(TOKEN_KEY);
  signOut.addEventListener('click', () => { sessionStorage.removeItem(TOKEN_KEY); location.reload(); });

  function ready() {
    if (body.dataset.ready) return;
    body.dataset.ready = '1';
    window.zfabReadyMs = performance.now();
  }

  // ---- the fabric's readiness, in the header --------------------------------------------------------

  function fabricStatus() {
    const el = $('#fabric');
    every(5000, async () => {
      let ok = false;
      try { ok = (await fetch(`${ROOT}/readyz`, { cache: 'no-store' })).ok; } catch (e) { ok = false; }
      el.textContent = ok ? 'fabric ready' : 'fabric not ready';
      el.className = `fabric ${ok ? 'up' : 'down'}`;
    });
  }

  window.zfab = {
    ROOT, PAGE_SIZE, STATES, FINAL, $, $$, enc, sleep, now, h, pad, epochOf,
    fmtTime, fmtDur, fmtLeft, fmtBytes, fmtEvery, fmtNum, badge, pretty, target, jobLink, ticking,
    tick, flash, report, ApiError, api, every, readStream, follow, ready,
    views: {},
  };

  /**
   * What the caller may do (GET /me): each allowed action becomes a class `can-<action>` on the body, and
   * console.css hides every element whose `data-needs` names an action the caller lacks. The API refuses
   * those calls all the same; this only spares a viewer buttons that would answer 403.
   */
  async function whoami() {
    try {
      const me = await api('/me');
      for (const a of me.actions || []) body.classList.add(`can-${a}`);
      body.dataset.role = me.role || '';
    } catch (e) {
      body.dataset.role = ''; // not signed in (the sign-in form is up), or an older API: nothing is shown
    }
  }

  document.addEventListener('DOMContentLoaded', async () => {
    fabricStatus();
    await whoami(); // before the view: its buttons are shown or hidden before its first data
    const view = window.zfab.views[VIEW];
    if (view) view();
  });
})();
