/* zfab console: plain JavaScript over the REST API. No framework, no build step, nothing from outside.
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
    let stopped = false;
    const key = {};
    const run = async () => {
      timer = 0;
      if (stopped) return;
      let wait = ms;
      if (!document.hidden) {
        const started = performance.now();
        try { await fn(); unflash(key); } catch (e) { report(e, key); }
        wait = Math.max(ms, 10 * (performance.now() - started));
      }
      if (!stopped) timer = setTimeout(run, wait);
    };
    document.addEventListener('visibilitychange', () => {
      if (!document.hidden && timer) { clearTimeout(timer); run(); }
    });
    run();
    return {
      stop() { stopped = true; clearTimeout(timer); },
      now() { if (timer) { clearTimeout(timer); run(); } },
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
    const r = await fetch(`${ROOT}/jobs?limit=1`, { headers: { Authorization: `Bearer ${token}` }, cache: 'no-store' });
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

  // ---- forms from JSON schemas --------------------------------------------------------------------

  /** What kind of input a JSON schema asks for. */
  function kindOf(schema, defs) {
    let s = schema || {};
    for (let i = 0; i < 8 && typeof s.$ref === 'string'; i += 1) s = (defs || {})[s.$ref.replace('#/$defs/', '')] || {};
    const options = s.anyOf || s.oneOf;
    if (Array.isArray(options)) {
      const real = options.filter((o) => o && o.type !== 'null');
      if (real.length === 1) return Object.assign(kindOf(real[0], defs), { nullable: true });
      return { kind: 'json' };
    }
    if (Array.isArray(s.enum)) return { kind: 'enum', options: s.enum };
    const type = Array.isArray(s.type) ? s.type.find((t) => t !== 'null') : s.type;
    if (type === 'string') return { kind: 'string' };
    if (type === 'integer') return { kind: 'integer', min: s.minimum, max: s.maximum };
    if (type === 'number') return { kind: 'number', min: s.minimum, max: s.maximum };
    if (type === 'boolean') return { kind: 'boolean' };
    if (type === 'array' || type === 'object') return { kind: 'json' };
    return { kind: 'any' };
  }

  /** One input for a schema: {el (to place), input, parse(), show(value)}. */
  function inputFor(name, schema, defs, required) {
    const k = kindOf(schema, defs);
    const hasDefault = schema && Object.prototype.hasOwnProperty.call(schema, 'default');
    const hint = hasDefault ? `default ${JSON.stringify(schema.default)}` : required ? 'required' : 'optional';
    const field = `kwargs.${name}`;
    let input;
    if (k.kind === 'enum' || k.kind === 'boolean') {
      const values = k.kind === 'enum' ? k.options : [true, false];
      input = h('select', { dataset: { field } },
        h('option', { value: '' }, required ? '— choose —' : `(${hint})`),
        values.map((v, i) => h('option', { value: String(i) }, typeof v === 'string' ? v : JSON.stringify(v))));
      input.values = values;
    } else if (k.kind === 'integer' || k.kind === 'number') {
      input = h('input', {
        type: 'number', step: k.kind === 'integer' ? '1' : 'any', min: k.min, max: k.max,
        placeholder: hasDefault ? String(schema.default) : '', dataset: { field },
      });
    } else if (k.kind === 'string') {
      input = h('input', { type: 'text', placeholder: hasDefault && schema.default !== null ? String(schema.default) : '', dataset: { field } });
    } else {
      input = h('textarea', {
        rows: '2', dataset: { field },
        placeholder: k.kind === 'json' ? 'JSON' : 'JSON, or plain text',
      });
      if (hasDefault) input.placeholder += `; ${hint}`;
    }
    const type = k.kind === 'any' ? 'any' : k.kind === 'enum' ? 'one of' : k.kind;
    const doc = (schema && (schema.description || (schema.title && schema.title.toLowerCase() !== name.toLowerCase() ? schema.title : ''))) || '';
    const el = h('div', { class: 'field' },
      h('span', {}, h('b', {}, name), ` ${type} · ${hint}${doc ? ` · ${doc}` : ''}`), input);
    return {
      el, input, required, name,
      parse() {
        const raw = input.value;
        if (input.validity && input.validity.badInput) throw new Error(`not a ${k.kind === 'integer' ? 'whole number' : 'number'}`);
        if (raw === '') return undefined;
        if (input.values) return input.values[Number(raw)];
        if (k.kind === 'integer' || k.kind === 'number') {
          const n = Number(raw);
          if (!isFinite(n) || (k.kind === 'integer' && !Number.isInteger(n))) throw new Error(`not a ${k.kind === 'integer' ? 'whole number' : 'number'}`);
          return n;
        }
        if (k.kind === 'string') return raw;
        try { return JSON.parse(raw); } catch (e) {
          if (k.kind === 'any') return raw;
          throw new Error(`not valid JSON (${e.message})`);
        }
      },
      show(v) {
        if (v === undefined) { input.value = ''; return; }
        if (input.values) { const i = input.values.findIndex((x) => JSON.stringify(x) === JSON.stringify(v)); input.value = i < 0 ? '' : String(i); return; }
        input.value = k.kind === 'string' && typeof v === 'string' ? v : (k.kind === 'integer' || k.kind === 'number') ? String(v) : JSON.stringify(v);
      },
    };
  }

  function clearErrors(form) {
    for (const el of $$('.field-error', form)) el.remove();
    for (const el of $$('.bad', form)) el.classList.remove('bad');
  }

  /** Show `msg` beside the input named by data-field; false when the form has no such input. */
  function fieldError(form, field, msg) {
    const input = $(`[data-field="${CSS.escape(field)}"]`, form);
    if (!input) return false;
    const box = input.closest('.field, label') || input.parentElement;
    box.classList.add('bad');
    box.append(h('span', { class: 'field-error' }, msg));
    return true;
  }

  /** A 422's errors by field (`kwargs.<name>` or a request field), and what names no field. */
  function problemFields(problem, argNames) {
    const byField = {};
    const rest = [];
    const add = (f, m) => { byField[f] = byField[f] ? `${byField[f]}; ${m}` : m; };
    if (Array.isArray(problem.errors)) {
      for (const e of problem.errors) {
        let loc = (e.loc || []).map(String);
        if (loc[0] === 'body' && loc[1] === 'job' && loc.length > 2) loc = ['body', ...loc.slice(2)]; // a schedule's job
        if (loc[0] === 'body' && loc[1] === 'kwargs' && loc.length > 2) add(`kwargs.${loc[2]}`, e.msg);
        else if (loc[0] === 'body' && loc[1]) add(loc[1], e.msg);
        else rest.push(`${e.field || loc.join('.')}: ${e.msg}`);
      }
    } else if (String(problem.type || '').endsWith('/bad-arguments')) {
      // "bad arguments for task 'x' of service 'y': seconds: expected number, got str 'abc'"
      const text = String(problem.detail || '').replace(/^bad arguments for task '.*?' of service '.*?': /, '');
      const m = text.match(/^(?:missing|unexpected) argument '([^']+)'/) || text.match(/^got argument '([^']+)' twice/)
        || text.match(/^([A-Za-z_]\w*)(?:[.[][^:]*)?: /);
      if (m && argNames.includes(m[1])) add(`kwargs.${m[1]}`, text);
      else rest.push(text);
    } else {
      rest.push(problem.detail || problem.title || 'the API refused the job');
    }
    return { byField, rest };
  }

  /**
   * A job form (templates/jobform.html inside `form`): service and task from MMI, argument fields from
   * the task's inputSchema. `send(request)` submits it and answers what to show once it went through.
   */
  function jobForm(form, send) {
    const svc = $('select[name=service]', form);
    const taskSel = $('select[name=task]', form);
    const args = $('fieldset.args', form);
    const doc = $('.doc', form);
    const errorEl = $('.form-error', form);
    const doneEl = $('.done', form);
    let tasks = [];
    let fields = [];
    let loaded = null;

    function build(values) {
      const t = tasks.find((x) => x.name === taskSel.value);
      const schema = (t && t.inputSchema) || {};
      doc.textContent = (t && t.description) || '';
      const props = schema.properties || {};
      const required = new Set(schema.required || []);
      fields = Object.entries(props).map(([name, s]) => inputFor(name, s, schema.$defs, required.has(name)));
      args.replaceChildren(h('legend', {}, 'Arguments'), ...(fields.length ? fields.map((f) => f.el) : [h('p', { class: 'muted' }, 'This task takes no arguments.')]));
      if (values) for (const f of fields) f.show(values[f.name]);
    }

    async function loadTasks(service, task, values) {
      tasks = await api(`/mmi/services/${enc(service)}/tasks`);
      tasks.sort((a, b) => a.name.localeCompare(b.name));
      taskSel.replaceChildren(...tasks.map((t) => h('option', { value: t.name }, t.name)));
      const names = tasks.map((t) => t.name);
      taskSel.value = task && names.includes(task) ? task : names.includes('echo') ? 'echo' : names[0] || '';
      build(values);
    }

    function load() {
      if (!loaded) {
        loaded = (async () => {
          const services = await api('/mmi/services');
          const names = services.map((s) => s.service).sort();
          svc.replaceChildren(...names.map((n) => h('option', { value: n }, n)));
          if (names.length) await loadTasks(names.includes('demo') ? 'demo' : names[0]);
          else args.replaceChildren(h('legend', {}, 'Arguments'), h('p', { class: 'muted' }, 'No service has a live worker.'));
        })();
        loaded.catch(() => { loaded = null; });
      }
      return loaded;
    }

    svc.addEventListener('change', () => loadTasks(svc.value).catch((e) => report(e)));
    taskSel.addEventListener('change', () => build());

    /** Fill the form with what a job asked (positional arguments go to the schema's names in order). */
    async function fill(req) {
      await load();
      if (![...svc.options].some((o) => o.value === req.service)) svc.append(h('option', { value: req.service }, req.service));
      svc.value = req.service;
      const t = await api(`/mmi/services/${enc(req.service)}/tasks`).catch(() => []);
      const names = Object.keys(((t.find((x) => x.name === req.task) || {}).inputSchema || {}).properties || {});
      const values = Object.assign({}, ...(req.args || []).map((v, i) => ({ [names[i]]: v })), req.kwargs || {});
      await loadTasks(req.service, req.task, values);
      const opts = {
        workers: req.workers === 'any' ? '' : typeof req.workers === 'string' ? req.workers : JSON.stringify(req.workers),
        timeout: req.timeout === 60 ? '' : req.timeout,
        priority: req.priority === 5 ? '' : req.priority,
        delay: req.delay || '',
        retries: req.retries || '',
      };
      for (const [k, v] of Object.entries(opts)) form.elements[k].value = v === undefined ? '' : String(v);
    }

    form.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      clearErrors(form);
      errorEl.textContent = '';
      doneEl.textContent = '';
      const kwargs = {};
      let bad = false;
      for (const f of fields) {
        try {
          const v = f.parse();
          if (v === undefined) { if (f.required) throw new Error('required'); continue; }
          kwargs[f.name] = v;
        } catch (e) { fieldError(form, `kwargs.${f.name}`, e.message); bad = true; }
      }
      const req = { service: svc.value, task: taskSel.value, kwargs };
      const w = form.elements.workers.value.trim();
      if (w) {
        try { req.workers = w.startsWith('[') ? JSON.parse(w) : w; } catch (e) { fieldError(form, 'workers', 'not a JSON list'); bad = true; }
      }
      for (const name of ['timeout', 'priority', 'delay', 'retries']) {
        const input = form.elements[name];
        if (input.validity.badInput) { fieldError(form, name, 'not a number'); bad = true; } else if (input.value !== '') req[name] = Number(input.value);
      }
      if (bad) return;
      try {
        doneEl.replaceChildren(...await send(req));
      } catch (e) {
        if (e.status === 401) return;
        if (!e.problem) { errorEl.textContent = e.message; return; }
        const { byField, rest } = problemFields(e.problem, fields.map((f) => f.name));
        for (const [field, msg] of Object.entries(byField)) if (!fieldError(form, field, msg)) rest.push(`${field}: ${msg}`);
        errorEl.textContent = rest.length || !Object.keys(byField).length ? rest.join('; ') || e.message : '';
      }
    });

    return { load, fill };
  }

  /** A panel holding a form, opened and closed by a button; `onOpen` runs each time it opens. */
  function panel(button, section, onOpen) {
    const open = (yes) => {
      section.hidden = !yes;
      button.setAttribute('aria-expanded', String(yes));
      if (yes) onOpen();
    };
    button.addEventListener('click', () => open(section.hidden));
    return open;
  }

  // ---- the jobs view ------------------------------------------------------------------------------

  function jobsView() {
    const rowsEl = $('#rows');
    const filters = $('#filters');
    const live = $('#live');
    const params = new URLSearchParams(location.search);
    let cursor = params.get('cursor');
    const newer = []; // the cursors of the pages before this one
    let page = null;
    let rendered = false;
    let generation = 0; // a reading started before the filters changed is not shown
    const rows = new Map(); // uuid -> {tr, key}

    for (const cb of $$('input[name=state]', filters)) cb.checked = params.getAll('state').includes(cb.value);
    for (const name of ['service', 'task', 'worker', 'schedule']) filters.elements[name].value = params.get(name) || '';
    for (const name of ['since', 'until']) {
      const t = epochOf(params.get(name));
      if (t) {
        const d = new Date(t * 1000);
        filters.elements[name].value = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}T${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
      }
    }

    function filterQuery() {
      const q = new URLSearchParams();
      for (const cb of $$('input[name=state]:checked', filters)) q.append('state', cb.value);
      for (const name of ['service', 'task', 'worker', 'schedule']) {
        const v = filters.elements[name].value.trim();
        if (v) q.set(name, v);
      }
      for (const name of ['since', 'until']) {
        const v = filters.elements[name].value;
        const d = v ? new Date(v) : null;
        if (d && !isNaN(d)) q.set(name, d.toISOString());
      }
      return q;
    }

    function syncUrl() {
      const q = filterQuery();
      if (cursor) q.set('cursor', cursor);
      const s = q.toString();
      history.replaceState(null, '', location.pathname + (s ? `?${s}` : ''));
    }

    function row(job) {
      const sub = epochOf(job.submitted_at);
      const start = epochOf(job.started_at);
      const fin = epochOf(job.finished_at);
      const done = FINAL.has(job.state);
      const wait = start !== null ? h('td', { class: 'num' }, fmtDur(start - sub)) : done ? h('td', { class: 'num' }, '–') : ticking(sub);
      let dur;
      if (start !== null && fin !== null) dur = h('td', { class: 'num' }, fmtDur(fin - start));
      else if (start !== null) dur = ticking(start);
      else if (fin !== null) dur = h('td', { class: 'num', title: 'from submission: it never started' }, fmtDur(fin - sub));
      else dur = h('td', { class: 'num' }, '–');
      return h('tr', { dataset: { uuid: job.uuid, state: job.state } },
        h('td', { class: 'nowrap' }, jobLink(job.uuid)),
        h('td', {}, job.service),
        h('td', {}, job.task),
        h('td', { class: 'nowrap' }, badge(job.state), job.cancel_requested && !done ? h('span', { class: 'muted' }, ' cancelling') : null),
        h('td', { class: 'mono' }, target(job.workers)),
        h('td', { class: 'nowrap', title: job.submitted_at }, fmtTime(sub)),
        wait, dur,
        h('td', {}, job.schedule ? h('a', { href: `${ROOT}/ui/schedules#s-${enc(job.schedule)}`, class: 'mono', title: job.schedule }, `…${job.schedule.slice(-8)}`) : ''),
        h('td', { class: 'reason', title: job.reason || '' }, job.reason || ''));
    }

    function render() {
      const filtered = [...filterQuery().keys()].length > 0;
      $('#total').textContent = `${fmtNum(page.total)} job${page.total === 1 ? '' : 's'} in the API's table${filtered ? ' · filtered' : ''}`;
      $('#older').disabled = !page.next;
      $('#newer').disabled = !newer.length;
      $('#page').textContent = `page ${newer.length + 1}${live.checked ? ' · live' : ''}`;
      if (!page.items.length) {
        rows.clear();
        rowsEl.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '10' },
          filtered ? 'No job matches these filters.' : 'No jobs yet: submit one with New job.')));
        rendered = true;
        return;
      }
      const seen = new Set();
      page.items.forEach((job, i) => {
        const key = JSON.stringify(job);
        let entry = rows.get(job.uuid);
        if (!entry || entry.key !== key) {
          const tr = row(job);
          if (rendered) {
            tr.classList.add('fresh');
            tr.addEventListener('animationend', () => tr.classList.remove('fresh'), { once: true });
          }
          if (entry) entry.tr.replaceWith(tr);
          entry = { tr, key };
          rows.set(job.uuid, entry);
        }
        seen.add(job.uuid);
        const at = rowsEl.children[i];
        if (at !== entry.tr) rowsEl.insertBefore(entry.tr, at || null);
      });
      for (const [uuid, entry] of rows) if (!seen.has(uuid)) { entry.tr.remove(); rows.delete(uuid); }
      for (const el of $$('tr.empty', rowsEl)) el.remove();
      while (rowsEl.children.length > page.items.length) rowsEl.lastElementChild.remove();
      rendered = true;
    }

    async function load() {
      const q = filterQuery();
      q.set('limit', String(PAGE_SIZE));
      if (cursor) q.set('cursor', cursor);
      const mine = generation;
      const got = await api(`/jobs?${q}`);
      if (mine !== generation) return;
      page = got;
      render();
      ready();
    }

    let poller = null;
    function restart() {
      if (poller) poller.stop();
      poller = live.checked ? every(1000, load) : null;
      if (!poller) load().catch((e) => report(e));
    }
    function reset() {
      generation += 1;
      cursor = null;
      newer.length = 0;
      rows.clear();
      rowsEl.replaceChildren();
      rendered = false;
      syncUrl();
      restart();
    }

    filters.addEventListener('submit', (ev) => { ev.preventDefault(); reset(); });
    for (const cb of $$('input[name=state]', filters)) cb.addEventListener('change', reset);
    $('#clear').addEventListener('click', () => { filters.reset(); for (const cb of $$('input[name=state]', filters)) cb.checked = false; reset(); });
    live.addEventListener('change', restart);
    $('#older').addEventListener('click', () => {
      if (!page || !page.next) return;
      generation += 1;
      newer.push(cursor);
      cursor = new URL(page.next, location.href).searchParams.get('cursor');
      syncUrl();
      restart();
    });
    $('#newer').addEventListener('click', () => {
      generation += 1;
      cursor = newer.pop() || null;
      syncUrl();
      restart();
    });
    setInterval(tick, 1000);
    restart();

    // Suggestions for the filters: names the fabric and the schedules know.
    const fillList = (id, values) => $(id).replaceChildren(...[...new Set(values)].sort().map((v) => h('option', { value: v })));
    api('/mmi/services').then((ss) => {
      fillList('#dl-services', ss.map((s) => s.service));
      fillList('#dl-tasks', ss.flatMap((s) => s.tasks || []));
    }).catch(() => {});
    api('/mmi/workers').then((ws) => fillList('#dl-workers', ws.map((w) => w.name))).catch(() => {});
    api('/schedules?limit=1000').then((p) => fillList('#dl-schedules', p.items.map((s) => s.id))).catch(() => {});

    // The submit form.
    const form = jobForm($('#job-form'), async (req) => {
      const job = await api('/jobs', { method: 'POST', body: req });
      if (poller) poller.now(); else load().catch((e) => report(e));
      return ['Submitted ', jobLink(job.uuid), ` (${job.state})`];
    });
    const open = panel($('#new-job'), $('#submit'), () => form.load().catch((e) => report(e)));
    const again = params.get('resubmit');
    if (again) {
      open(true);
      api(`/ui/api/jobs/${enc(again)}/request`).then((req) => form.fill(req)).catch((e) => report(e));
    }
  }

  // ---- the job view -------------------------------------------------------------------------------

  function jobView() {
    const uuid = body.dataset.job;
    let job = null;
    let request = null;
    const events = [];
    const progress = new Map(); // worker -> {el, fill, text}
    let poller = null;
    let inputFor_ = null;

    const fact = (k, v) => [h('dt', {}, k), h('dd', {}, v)];

    function renderSummary() {
      const sub = epochOf(job.submitted_at);
      const start = epochOf(job.started_at);
      const fin = epochOf(job.finished_at);
      const ran = Object.keys(job.results || {}).sort();
      $('#summary').replaceChildren(
        ...fact('uuid', h('span', { class: 'mono' }, job.uuid)),
        ...fact('service · task', `${job.service} · ${job.task}`),
        ...fact('target', h('span', { class: 'mono' }, target(job.workers))),
        ...(ran.length ? fact('ran on', ran.join(', ')) : []),
        ...fact('state', [badge(job.state), job.cancel_requested && !FINAL.has(job.state) ? ' cancel requested' : '']),
        ...(job.reason ? fact('reason', job.reason) : []),
        ...fact('priority · retries', `${job.priority} · ${job.retries}`),
        ...(request ? fact('timeout · delay', `${request.timeout} s · ${request.delay} s`) : []),
        ...(job.schedule ? fact('schedule', h('a', { href: `${ROOT}/ui/schedules#s-${enc(job.schedule)}`, class: 'mono' }, job.schedule)) : []),
        ...fact('submitted', h('span', { title: job.submitted_at }, fmtTime(sub, true))),
        ...fact('waited', start !== null ? fmtDur(start - sub) : FINAL.has(job.state) ? '–' : h('span', { dataset: { since: String(sub) } }, '')),
        ...fact('ran for', start !== null && fin !== null ? fmtDur(fin - start) : start !== null ? h('span', { dataset: { since: String(start) } }, '') : '–'),
        ...(fin !== null ? fact('finished', h('span', { title: job.finished_at }, `${fmtTime(fin, true)} (${fmtDur(fin - sub)} after submission)`)) : []),
      );
      tick();
    }

    function renderResults() {
      const out = [];
      if (job.error) out.push(h('p', { class: 'error' }, `${job.error.type}: ${job.error.message}`));
      for (const worker of Object.keys(job.results || {}).sort()) {
        const e = job.results[worker] || {};
        const failed = !!e.failed;
        out.push(h('div', { class: `result${failed ? ' failed' : ''}` },
          h('h3', {}, worker, badge(failed ? 'failed' : 'completed'),
            e.status && e.status !== (failed ? 'failed' : 'completed') ? h('span', { class: 'muted' }, e.status) : null),
          failed && (e.errors || []).length ? h('pre', { class: 'json errors' }, (e.errors || []).join('\n')) : null,
          (e.messages || []).length && !failed ? h('p', { class: 'muted' }, (e.messages || []).join(' · ')) : null,
          h('pre', { class: 'json' }, pretty(e.result === undefined ? null : e.result))));
      }
      if (!out.length) out.push(h('p', { class: 'muted' }, FINAL.has(job.state) ? 'The job ended without a result.' : 'No result yet: the job is ' + job.state + '.'));
      $('#results').replaceChildren(...out);
    }

    function renderHistory() {
      const items = [];
      const add = (state, iso, what) => items.push({ state, t: epochOf(iso), what });
      add('submitted', job.submitted_at, 'the API took the job');
      if (job.queued_at) add('queued', job.queued_at, 'the broker admitted it');
      if (job.started_at) add('running', job.started_at, `a worker started it${Object.keys(job.results || {}).length ? ` (${Object.keys(job.results).sort().join(', ')})` : ''}`);
      for (const e of events) {
        if (e.event_type === 'input_request') add('waiting', e.timestamp, `${e.worker || 'the worker'} asked: ${e.message}`);
        else if (e.event_type === 'input_response') add('running', e.timestamp || null, `${e.worker || 'the worker'}: ${e.message}`);
      }
      if (job.cancel_requested) items.push({ state: 'cancelled', t: null, what: 'cancel requested (DELETE)' });
      if (FINAL.has(job.state)) add(job.state, job.finished_at, job.reason || (job.state === 'completed' ? 'every worker returned' : ''));
      items.sort((a, b) => (a.t === null ? Infinity : a.t) - (b.t === null ? Infinity : b.t));
      $('#history tbody').replaceChildren(...items.map((i) => h('tr', {},
        h('td', {}, i.state === 'submitted' ? h('span', { class: 'badge' }, 'submitted') : badge(i.state)),
        h('td', { class: 'nowrap' }, i.t === null ? '–' : fmtTime(i.t, true)),
        h('td', {}, i.what))));
    }

    function renderTimings() {
      const T = job.timings || {};
      const hops = [];
      const add = (label, t) => { if (typeof t === 'number') hops.push({ label, t }); };
      add('API: submitted', T.submitted);
      add('broker: queued', T.queued);
      add('broker: dispatched (202)', T.dispatched);
      add('API: started (201)', T.started);
      add('API: recovered after a restart', T.recovered);
      add('API: result', T.completed);
      for (const [w, e] of Object.entries(job.results || {})) {
        const ts = (e && e.timestamps) || {};
        add(`${w}: received`, ts.received);
        add(`${w}: task started`, ts.started);
        add(`${w}: task ended`, ts.completed);
      }
      hops.sort((a, b) => a.t - b.t);
      const tbody = $('#timings tbody');
      if (!hops.length) { tbody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '5' }, 'No timings recorded.'))); return; }
      const t0 = typeof T.submitted === 'number' ? T.submitted : hops[0].t;
      const span = Math.max(hops[hops.length - 1].t - t0, 1e-6);
      let prev = t0;
      tbody.replaceChildren(...hops.map((hop) => {
        const bar = h('span');
        bar.style.left = `${Math.max(0, ((prev - t0) / span) * 100)}%`;
        bar.style.width = `${Math.max(0, ((hop.t - prev) / span) * 100)}%`;
        const tr = h('tr', {}, h('td', { class: 'nowrap' }, hop.label), h('td', { class: 'nowrap' }, fmtTime(hop.t, true)),
          h('td', { class: 'num' }, `+${fmtDur(hop.t - t0)}`), h('td', { class: 'num' }, fmtDur(hop.t - prev)),
          h('td', {}, h('div', { class: 'hopbar' }, bar)));
        prev = Math.max(prev, hop.t);
        return tr;
      }));
    }

    function renderInput() {
      const panel = $('#input');
      const req = job.state === 'waiting' ? job.input_request : null;
      if (!req) { panel.hidden = true; inputFor_ = null; return; }
      if (inputFor_ && inputFor_.id === req.id) return;
      panel.hidden = false;
      $('#question').replaceChildren(h('b', {}, req.question || 'The worker asks for input'),
        h('span', { class: 'muted' }, ` · from ${req.worker || 'a worker'}${req.timeout ? `, answer within ${fmtDur(req.timeout)}` : ''}`));
      const f = inputFor('answer', req.schema || {}, (req.schema || {}).$defs, true);
      f.input.dataset.field = 'value';
      inputFor_ = { id: req.id, field: f };
      $('#answer-field').replaceChildren(f.el);
      $('#input-error').textContent = '';
    }

    function render() {
      const st = $('#state');
      st.className = `badge st-${job.state}`;
      st.textContent = job.state;
      document.title = `${job.task} ${job.state} · zfab`;
      $('#cancel').disabled = FINAL.has(job.state) || job.cancel_requested;
      renderSummary();
      renderResults();
      renderHistory();
      renderTimings();
      renderInput();
    }

    function onEvent(e, seq) {
      events.push(e);
      $('#event-count').textContent = `(${events.length})`;
      const tbody = $('#events tbody');
      for (const el of $$('tr.empty', tbody)) el.remove();
      const pct = typeof e.progress === 'number' ? e.progress : null;
      tbody.append(h('tr', {},
        h('td', { class: 'num' }, String(seq || events.length)),
        h('td', { class: 'nowrap' }, e.timestamp ? fmtTime(epochOf(e.timestamp), true) : '–'),
        h('td', {}, e.worker || ''),
        h('td', {}, e.event_type || ''),
        h('td', {}, e.message || ''),
        h('td', { class: 'num' }, pct === null ? '' : `${Math.round(pct * 100)} %`)));
      if (pct !== null) {
        const who = e.worker || 'job';
        let bar = progress.get(who);
        if (!bar) {
          const fill = h('div', { class: 'fill' });
          const text = h('span', { class: 'num' });
          const el = h('div', { class: 'progress' }, h('span', {}, who), h('div', { class: 'track' }, fill), text);
          bar = { el, fill, text };
          progress.set(who, bar);
          $('#progress').append(el);
        }
        bar.fill.style.width = `${Math.min(100, Math.max(0, pct * 100))}%`;
        bar.text.textContent = `${Math.round(pct * 100)} %`;
        bar.el.classList.toggle('done', pct >= 1);
      }
      if (e.event_type === 'input_request' || e.event_type === 'input_response') {
        refresh().catch(() => {});
      } else if (job) {
        renderHistory();
      }
    }

    /** Show the job as an answer has it; answers cross (a DELETE's, the stream's end): the end stays. */
    function update(fresh) {
      if (job && FINAL.has(job.state) && !FINAL.has(fresh.state)) return;
      job = fresh;
      render();
      if (FINAL.has(job.state) && poller) { poller.stop(); poller = null; }
    }

    async function refresh() {
      update(await api(`/jobs/${enc(uuid)}`));
      return job;
    }

    $('#cancel').addEventListener('click', async () => {
      try {
        update(await api(`/jobs/${enc(uuid)}`, { method: 'DELETE' }));
        flash('Cancel sent: a queued job leaves the queue, a running one is asked to stop.', { ok: true });
      } catch (e) { report(e); }
    });

    $('#again').addEventListener('click', async () => {
      if (!request) return;
      try {
        const fresh = await api('/jobs', { method: 'POST', body: request });
        location.assign(`${ROOT}/ui/jobs/${enc(fresh.uuid)}`);
      } catch (e) { report(e); }
    });

    $('#input-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!inputFor_) return;
      const form = ev.target;
      clearErrors(form);
      $('#input-error').textContent = '';
      let value;
      try {
        value = inputFor_.field.parse();
        if (value === undefined) throw new Error('required');
      } catch (e) { fieldError(form, 'value', e.message); return; }
      try {
        update(await api(`/jobs/${enc(uuid)}/input`, { method: 'POST', body: { value, input_id: inputFor_.id } }));
        flash('Answer sent.', { ok: true });
      } catch (e) {
        if (e.status !== 401) $('#input-error').textContent = e.message;
      }
    });

    setInterval(tick, 1000);
    (async () => {
      try {
        await refresh();
      } catch (e) {
        if (e.status === 404) {
          $('#state').textContent = 'not found';
          $('#note').textContent = e.message;
          ready();
          return;
        }
        report(e);
        return;
      }
      ready();
      // Queued -> running is no event: read the job each second until it ends (events stream meanwhile).
      if (!FINAL.has(job.state)) poller = every(1000, refresh);
      follow(uuid, onEvent, (end) => {
        update(end);
        if (!events.length) $('#events tbody').replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '6' }, 'The job sent no events.')));
      });
      try {
        request = await api(`/ui/api/jobs/${enc(uuid)}/request`);
        $('#args').textContent = pretty(Object.assign({ args: request.args, kwargs: request.kwargs },
          request.workers !== 'any' ? { workers: request.workers } : {}));
        $('#again').disabled = false;
        $('#edit').hidden = false;
        renderSummary();
      } catch (e) {
        $('#args').textContent = e.status === 404 ? 'The API does not hold what this job was submitted with.' : e.message;
      }
    })();
  }

  // ---- the queues view ----------------------------------------------------------------------------

  function meter(part, whole) {
    const share = whole ? Math.min(1, part / whole) : 0;
    const fill = h('span');
    fill.style.width = `${(share * 100).toFixed(1)}%`;
    return h('span', { class: `meter${share > 0.8 ? ' hot' : ''}`, title: `${fmtNum(part)} of ${fmtNum(whole)}` }, fill);
  }

  function cardValue(k, main, small) {
    const el = $(`#cards [data-k="${k}"]`);
    el.replaceChildren(main, small ? h('small', {}, ` ${small}`) : '');
  }

  /** A small line of the last readings (an inline SVG: drawn in the page, nothing fetched). */
  function sparkline(values) {
    const ns = 'http://www.w3.org/2000/svg';
    const w = 120;
    const ht = 22;
    const svg = document.createElementNS(ns, 'svg');
    svg.setAttribute('viewBox', `0 0 ${w} ${ht}`);
    svg.setAttribute('class', 'spark');
    const top = Math.max(1, ...values);
    const step = w / Math.max(1, HISTORY - 1);
    const pts = values.map((v, i) => `${(w - (values.length - 1 - i) * step).toFixed(1)},${(ht - 1 - (v / top) * (ht - 3)).toFixed(1)}`);
    const line = document.createElementNS(ns, 'polyline');
    line.setAttribute('points', pts.join(' '));
    svg.append(line);
    const label = document.createElementNS(ns, 'title');
    label.textContent = `depth over the last ${values.length} readings, peak ${top}`;
    svg.append(label);
    return svg;
  }
  const HISTORY = 60; // readings kept per service for the sparkline: two minutes at one every two seconds

  function queuesView() {
    let prev = null;
    const depths = new Map(); // service -> recent queue depths
    every(2000, async () => {
      const [broker, services] = await Promise.all([api('/mmi/broker'), api('/mmi/services')]);
      const t = now();
      cardValue('queued', fmtNum(broker.jobs_queued), `at most ${fmtNum(broker.service_queue_capacity)} a service`);
      cardValue('bytes', fmtBytes(broker.queue_bytes), `of ${fmtBytes(broker.queue_bytes_capacity)}, with ${fmtBytes(broker.dispatched_bytes)} dispatched`);
      cardValue('inflight', fmtNum(broker.jobs_in_flight), `of ${fmtNum(broker.jobs_in_flight_capacity)}`);
      cardValue('workers', fmtNum(broker.workers), `${fmtNum(broker.services)} service${broker.services === 1 ? '' : 's'}`);
      cardValue('clients', fmtNum(broker.clients), `of ${fmtNum(broker.clients_capacity)}`);
      cardValue('uptime', fmtDur(broker.uptime_s), broker.version ? `v${broker.version}` : '');
      const tbody = $('#queues tbody');
      const track = (name, depth) => {
        const list = depths.get(name) || [];
        list.push(depth);
        if (list.length > HISTORY) list.shift();
        depths.set(name, list);
        return list;
      };
      services.sort((a, b) => a.service.localeCompare(b.service));
      if (!services.length) {
        tbody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '14' }, 'No service: no worker has registered with the broker.')));
      } else {
        tbody.replaceChildren(...services.map((s) => {
          const before = prev ? prev.counts[s.service] : undefined;
          const rate = before !== undefined && t > prev.t ? (s.jobs_dispatched - before) / (t - prev.t) : null;
          const hist = s.queued_seconds || {};
          const num = (v) => h('td', { class: 'num' }, v);
          return h('tr', {},
            h('td', {}, h('b', {}, s.service), s.tentative ? h('span', { class: 'muted' }, ' (tentative)') : ''),
            num(fmtNum(s.queue_depth)),
            h('td', {}, sparkline(track(s.service, s.queue_depth || 0))),
            h('td', { class: 'nowrap' }, meter(s.queue_depth || 0, s.queue_capacity || 0), h('span', { class: 'muted' }, ` of ${fmtNum(s.queue_capacity)}`)),
            num(fmtBytes(s.queue_bytes)),
            num(s.queue_depth ? fmtDur(s.queue_oldest_age_s) : '–'),
            num(fmtNum(s.queue_delayed)),
            num(fmtNum(s.queue_parked)),
            num(fmtNum(s.jobs_in_flight)),
            num(fmtNum(s.credits)),
            num(`${fmtNum(s.alive)} / ${fmtNum(s.workers)}`),
            num(rate === null ? '…' : rate.toFixed(rate < 10 ? 1 : 0)),
            num(hist.count ? fmtDur(hist.sum / hist.count) : '–'),
            num(fmtNum((s.expired_in_queue || 0) + (s.expired_in_flight || 0))));
        }));
      }
      prev = { t, counts: Object.fromEntries(services.map((s) => [s.service, s.jobs_dispatched])) };
      $('#updated').textContent = `read ${fmtTime(t)}`;
      ready();
    });
  }

  // ---- the workers view ---------------------------------------------------------------------------

  function workersView() {
    every(2000, async () => {
      const [workers, services, broker] = await Promise.all([
        api('/mmi/workers'), api('/mmi/services').catch(() => []), api('/mmi/broker').catch(() => null)]);
      const tasks = Object.fromEntries(services.map((s) => [s.service, s.tasks || []]));
      const hold = broker ? broker.keepalive_interval_s * broker.keepalive_multiplier : null;
      workers.sort((a, b) => a.service.localeCompare(b.service) || a.name.localeCompare(b.name));
      const alive = workers.filter((w) => w.alive).length;
      $('#count').textContent = `${alive} alive of ${workers.length}`;
      const tbody = $('#workers tbody');
      if (!workers.length) {
        tbody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '12' }, 'No worker has registered with the broker.')));
      } else {
        tbody.replaceChildren(...workers.map((w) => {
          const r = w.reported || {};
          const state = !w.alive ? 'dead' : w.draining ? 'draining' : 'alive';
          const heard = hold !== null && typeof w.holdtime_left_s === 'number' ? hold - w.holdtime_left_s : null;
          const num = (v) => h('td', { class: 'num' }, v);
          return h('tr', {},
            h('td', { class: 'nowrap' }, h('b', {}, w.name)),
            h('td', {}, w.service),
            h('td', {}, badge(state)),
            num(`${fmtNum(w.credits_free)} free / ${fmtNum(w.credits)}`),
            num(fmtNum(w.jobs_in_flight)),
            num(`${fmtNum(r.jobs_running)} / ${fmtNum(r.pool_size)}`),
            num(heard === null ? '–' : `${fmtDur(heard)} ago`),
            num(fmtDur(w.holdtime_left_s)),
            num(`${fmtNum(w.keepalives_sent)} / ${fmtNum(w.keepalives_received)}`),
            num(fmtDur(w.alive_for_s)),
            num(`${fmtNum(r.jobs_completed)} / ${fmtNum(r.jobs_failed)}`),
            h('td', {}, h('span', { class: 'tags' }, (tasks[w.service] || []).map((t) => h('span', { class: 'tag' }, t)))));
        }));
      }
      $('#updated').textContent = `read ${fmtTime(now())}`;
      ready();
    });
  }

  // ---- the schedules view -------------------------------------------------------------------------

  function schedulesView() {
    const rows = new Map(); // id -> {tr, key}
    let poller = null;

    async function act(fn) {
      try { await fn(); } catch (e) { report(e); }
      if (poller) poller.now();
    }

    function row(s) {
      const next = epochOf(s.next_run_at);
      const last = epochOf(s.last_run_at);
      const pauseBtn = h('button', {
        type: 'button', class: 'small', dataset: { action: s.paused ? 'resume' : 'pause' },
        onclick: () => act(() => api(`/schedules/${enc(s.id)}`, { method: 'PATCH', body: { paused: !s.paused } })),
      }, s.paused ? 'Resume' : 'Pause');
      const deleteBtn = h('button', { type: 'button', class: 'small danger', dataset: { action: 'delete' } }, 'Delete');
      deleteBtn.addEventListener('click', () => {
        if (deleteBtn.dataset.armed) { act(() => api(`/schedules/${enc(s.id)}`, { method: 'DELETE' })); return; }
        deleteBtn.dataset.armed = '1';
        deleteBtn.textContent = 'Really delete?';
        setTimeout(() => { delete deleteBtn.dataset.armed; deleteBtn.textContent = 'Delete'; }, 4000);
      });
      const job = s.job || {};
      return h('tr', { id: `s-${s.id}`, dataset: { id: s.id, state: s.state } },
        h('td', {}, h('b', {}, s.name || s.id), s.name ? h('div', { class: 'muted mono' }, s.id) : null),
        h('td', {}, `${job.service} · ${job.task}`, job.kwargs && Object.keys(job.kwargs).length ? h('div', { class: 'muted mono' }, JSON.stringify(job.kwargs)) : null),
        h('td', { class: 'mono nowrap' }, s.every ? `every ${fmtEvery(s.every)}` : `cron ${s.cron} (UTC)`),
        h('td', {}, badge(s.state)),
        h('td', { class: 'nowrap' }, next === null ? '–' : [fmtTime(next), ' ', h('span', { class: 'muted', dataset: { until: String(next) } }, '')]),
        h('td', { class: 'nowrap' }, last === null ? 'never' : fmtTime(last)),
        h('td', { class: 'num' }, fmtNum(s.runs)),
        h('td', { class: 'num', title: s.last_error || '' }, fmtNum(s.failures)),
        h('td', {}, h('span', { class: 'tags' },
          s.last_jobs.slice(0, 3).map((u) => h('a', { href: `${ROOT}/ui/jobs/${enc(u)}`, class: 'tag', title: u }, u.slice(-8))),
          h('a', { href: `${ROOT}/ui?schedule=${enc(s.id)}` }, s.runs ? 'all →' : 'jobs →'))),
        h('td', { class: 'nowrap' }, pauseBtn, ' ', deleteBtn));
    }

    poller = every(2000, async () => {
      const page = await api('/schedules?limit=1000');
      $('#count').textContent = `${page.total} schedule${page.total === 1 ? '' : 's'}`;
      const tbody = $('#schedules tbody');
      if (!page.items.length) {
        rows.clear();
        tbody.replaceChildren(h('tr', { class: 'empty' }, h('td', { colspan: '10' }, 'No schedules yet.')));
      } else {
        const seen = new Set();
        page.items.forEach((s, i) => {
          const key = JSON.stringify(s);
          let entry = rows.get(s.id);
          if (!entry || entry.key !== key) {
            const tr = row(s);
            if (entry) entry.tr.replaceWith(tr);
            entry = { tr, key };
            rows.set(s.id, entry);
          }
          seen.add(s.id);
          const at = tbody.children[i];
          if (at !== entry.tr) tbody.insertBefore(entry.tr, at || null);
        });
        for (const [id, entry] of rows) if (!seen.has(id)) { entry.tr.remove(); rows.delete(id); }
        for (const el of $$('tr.empty', tbody)) el.remove();
      }
      tick();
      $('#updated').textContent = `read ${fmtTime(now())}`;
      ready();
    });
    setInterval(tick, 1000);

    const form = $('#schedule-form');
    const jobs = jobForm(form, async (job) => {
      const req = { job, paused: form.elements.paused.checked };
      const name = form.elements.name.value.trim();
      const cron = form.elements.cron.value.trim();
      if (name) req.name = name;
      if (cron) req.cron = cron;
      if (form.elements.every.value !== '') req.every = Number(form.elements.every.value);
      const s = await api('/schedules', { method: 'POST', body: req });
      poller.now();
      return [`Created schedule ${s.id}`, s.next_run_at ? `, first firing at ${fmtTime(epochOf(s.next_run_at))}` : ''];
    });
    panel($('#new-schedule'), $('#submit'), () => jobs.load().catch((e) => report(e)));
  }

  // ---- start --------------------------------------------------------------------------------------

  fabricStatus();
  const views = { jobs: jobsView, job: jobView, queues: queuesView, workers: workersView, schedules: schedulesView };
  (views[VIEW] || (() => {}))();
})();
