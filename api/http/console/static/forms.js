/* zfab console: forms built from JSON schemas (a task's arguments, an input request's answer), the job
 * form of the jobs and schedules views, and errors shown beside the fields they name. */
(() => {
  'use strict';

  const { $, $$, enc, h, report, api } = window.zfab;

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
      for (const name of req.redacted || []) delete values[name]; // secret: shown as *** and asked for again
      await loadTasks(req.service, req.task, values);
      const opts = {
        workers: req.workers === 'any' ? '' : typeof req.workers === 'string' ? req.workers : JSON.stringify(req.workers),
        timeout: req.timeout === 60 ? '' : req.timeout,
        priority: req.priority === 5 ? '' : req.priority,
        delay: req.delay || '',
        retries: req.retries ?? '',
        backoff: req.backoff ?? '',
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
      for (const name of ['timeout', 'priority', 'delay', 'retries', 'backoff']) {
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

  Object.assign(window.zfab, { inputFor, clearErrors, fieldError, problemFields, jobForm, panel });
})();
