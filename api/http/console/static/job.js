/* zfab console: a job's view (/ui/jobs/{uuid}): summary, arguments, results, events, history, timings. */
(() => {
  'use strict';

  const {
    ROOT, FINAL, $, $$, enc, h, epochOf, fmtTime, fmtDur, badge, pretty, target, tick, flash, report, api,
    every, follow, ready, inputFor, clearErrors, fieldError, now, fmtLeft,
  } = window.zfab;

  // ---- the job view -------------------------------------------------------------------------------

  function jobView() {
    const uuid = document.body.dataset.job;
    let job = null;
    let request = null;
    const events = [];
    const progress = new Map(); // worker -> {el, fill, text}
    let poller = null;
    let asked = null;

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
        ...fact('priority · retries', `${job.priority} · ${job.retries ?? 'as its task declares'}`),
        ...(job.attempt > 1 ? fact('attempt', `${job.attempt}, after ${(job.attempts || []).length} that failed (see the history)`) : []),
        ...(request ? fact('timeout · delay', `${request.timeout} s · ${request.delay} s`) : []),
        ...(job.schedule ? fact('schedule', h('a', { href: `${ROOT}/ui/schedules#s-${enc(job.schedule)}`, class: 'mono' }, job.schedule)) : []),
        ...fact('submitted', h('span', { title: job.submitted_at }, fmtTime(sub, true))),
        ...fact('waited', start !== null ? fmtDur(start - sub) : FINAL.has(job.state) ? '–' : h('span', { dataset: { since: String(sub) } }, '')),
        ...fact('ran for', start !== null && fin !== null ? fmtDur(fin - start) : start !== null ? h('span', { dataset: { since: String(start) } }, '') : '–'),
        ...(fin !== null ? fact('finished', h('span', { title: job.finished_at }, `${fmtTime(fin, true)} (${fmtDur(fin - sub)} after submission)`)) : []),
      );
      tick();
    }

    /** A failed entry: its error in one line, then the traceback when the API shows it to this caller
     *  (ZFAB_API_EXPOSE_TRACEBACKS, or a token of ZFAB_API_TRACEBACK_TOKENS); others see type and message. */
    function failure(e) {
      const errors = (e.errors || []).map(String);
      const tbs = errors.filter((x) => x.startsWith('Traceback'));
      const rest = errors.filter((x) => !x.startsWith('Traceback'));
      const said = (e.messages || []).join(' · ') || rest[0] || (tbs.length ? tbs[0].trim().split('\n').pop() : '') || 'the task failed';
      return [
        h('p', { class: 'error task-error' }, said),
        rest.length && rest.join('\n') !== said ? h('pre', { class: 'json errors' }, rest.join('\n')) : null,
        tbs.length ? h('details', { class: 'traceback', open: true }, h('summary', {}, 'Traceback'),
          h('pre', { class: 'json errors' }, tbs.join('\n'))) : null,
      ];
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
          ...(failed ? failure(e) : []),
          (e.messages || []).length && !failed ? h('p', { class: 'muted' }, (e.messages || []).join(' · ')) : null,
          h('pre', { class: 'json' }, pretty(e.result === undefined ? null : e.result))));
      }
      if (!out.length) out.push(h('p', { class: 'muted' }, FINAL.has(job.state) ? 'The job ended without a result.' : 'No result yet: the job is ' + job.state + '.'));
      $('#results').replaceChildren(...out);
    }

    /** The job's history as the API places it: each state at the time the broker or worker that saw it
     *  says (docs/protocol.md, "Times across processes"), in order. */
    function renderHistory() {
      if (Array.isArray(job.history) && job.history.length) {
        const rows = job.history.map((s) => h('tr', {},
          h('td', {}, s.state === 'submitted' ? h('span', { class: 'badge' }, 'submitted') : badge(s.state)),
          h('td', { class: 'nowrap', title: s.at }, fmtTime(epochOf(s.at), true)),
          h('td', {}, [s.by === 'worker' && s.worker ? `${s.worker}: ` : `${s.by}: `, s.note || ''])));
        if (job.cancel_requested && !FINAL.has(job.state)) rows.push(h('tr', {}, h('td', {}, badge('cancelled')), h('td', {}, '–'), h('td', {}, 'cancel requested (DELETE)')));
        $('#history tbody').replaceChildren(...rows);
        return;
      }
      const items = [];
      const add = (state, iso, what) => items.push({ state, t: epochOf(iso), what });
      add('submitted', job.submitted_at, 'the API took the job');
      if (job.queued_at) add('queued', job.queued_at, 'the broker admitted it');
      if (job.started_at) add('running', job.started_at, `a worker started it${Object.keys(job.results || {}).length ? ` (${Object.keys(job.results).sort().join(', ')})` : ''}`);
      for (const e of events) {
        if (e.event_type === 'input_request') add('waiting', e.timestamp, `${e.worker || 'the worker'} asked: ${e.message}`);
        else if (e.event_type === 'input_response') add('running', e.timestamp || null, `${e.worker || 'the worker'}: ${e.message}`);
      }
      for (const a of job.attempts || []) {
        const next = typeof a.retry_after === 'number' ? `; the next attempt waited ${fmtDur(a.retry_after)}` : '';
        add(a.status === 'lost' ? 'lost' : 'failed', a.finished_at || a.started_at, `attempt ${a.attempt}${a.worker ? ` on ${a.worker}` : ''}: ${a.error || a.status}${next}`);
      }
      if (job.cancel_requested) items.push({ state: 'cancelled', t: null, what: 'cancel requested (DELETE)' });
      if (FINAL.has(job.state)) add(job.state, job.finished_at, job.reason || (job.state === 'completed' ? 'every worker returned' : ''));
      items.sort((a, b) => (a.t === null ? Infinity : a.t) - (b.t === null ? Infinity : b.t));
      $('#history tbody').replaceChildren(...items.map((i) => h('tr', {},
        h('td', {}, i.state === 'submitted' ? h('span', { class: 'badge' }, 'submitted') : badge(i.state)),
        h('td', { class: 'nowrap' }, i.t === null ? '–' : fmtTime(i.t, true)),
        h('td', {}, i.what))));
    }

    // A finished job's hop trace: durations each process measured on its own clock (docs/protocol.md).
    const HOP_LABELS = {
      api: 'API: request read → submitted',
      client_broker: 'client ⇄ broker (both ways)',
      broker_queue: 'broker: in its queue',
      broker_worker: 'broker ⇄ worker (both ways)',
      worker_queue: 'worker: waiting for a thread',
      run: 'worker: the task ran',
      worker_result: 'worker: result out',
    };

    function renderTrace(trace) {
      const tbody = $('#timings tbody');
      $('#timings thead').replaceChildren(h('tr', {}, h('th', {}, 'Hop'), h('th', {}, 'Key'),
        h('th', { class: 'num' }, '+ since submit'), h('th', { class: 'num' }, 'took'), h('th', { class: 'wide' })));
      const hops = Object.entries(trace.hops || {});
      const span = Math.max(trace.total || 0, 1e-6);
      let at = 0;
      const rows = hops.map(([hop, secs]) => {
        const bar = h('span');
        bar.style.left = `${Math.min(100, (at / span) * 100)}%`;
        bar.style.width = `${Math.max(0, (secs / span) * 100)}%`;
        at += secs;
        return h('tr', {}, h('td', { class: 'nowrap' }, HOP_LABELS[hop] || hop), h('td', { class: 'nowrap' }, hop),
          h('td', { class: 'num' }, `+${fmtDur(at)}`), h('td', { class: 'num' }, fmtDur(secs)),
          h('td', {}, h('div', { class: 'hopbar' }, bar)));
      });
      rows.push(h('tr', {}, h('td', { class: 'nowrap' }, h('strong', {}, 'end to end')), h('td', {}, ''),
        h('td', { class: 'num' }, ''), h('td', { class: 'num' }, fmtDur(trace.total || 0)), h('td', {}, '')));
      tbody.replaceChildren(...rows);
    }

    function renderTimings() {
      if (job.trace && job.trace.hops && Object.keys(job.trace.hops).length) { renderTrace(job.trace); return; }
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
      const box = $('#input');
      const req = job.state === 'waiting' ? job.input_request : null;
      if (!req) { box.hidden = true; asked = null; return; }
      if (asked && asked.id === req.id) return;
      box.hidden = false;
      const left = typeof req.expires_in === 'number' ? req.expires_in : null;
      $('#question').replaceChildren(h('b', {}, req.question || 'The worker asks for input'),
        h('span', { class: 'muted' }, ` · from ${req.worker || 'a worker'}${req.timeout ? `, answer within ${fmtDur(req.timeout)}` : ''}`),
        ...(left !== null ? [' · ', h('span', { id: 'countdown', class: 'countdown', dataset: { deadline: String(now() + left) } }, `${fmtLeft(left)} left`)] : []));
      const f = inputFor('answer', req.schema || {}, (req.schema || {}).$defs, true);
      f.input.dataset.field = 'value';
      asked = { id: req.id, field: f };
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
      const { redacted, omitted, ...body } = request; // the body of POST /jobs, as it was
      try {
        const fresh = await api('/jobs', { method: 'POST', body });
        location.assign(`${ROOT}/ui/jobs/${enc(fresh.uuid)}`);
      } catch (e) { report(e); }
    });

    $('#input-form').addEventListener('submit', async (ev) => {
      ev.preventDefault();
      if (!asked) return;
      const form = ev.target;
      clearErrors(form);
      $('#input-error').textContent = '';
      let value;
      try {
        value = asked.field.parse();
        if (value === undefined) throw new Error('required');
      } catch (e) { fieldError(form, 'value', e.message); return; }
      try {
        update(await api(`/jobs/${enc(uuid)}/input`, { method: 'POST', body: { value, input_id: asked.id } }));
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
        const secret = request.redacted || [];
        $('#args').replaceChildren(
          request.omitted ? request.omitted : pretty(Object.assign({ args: request.args, kwargs: request.kwargs },
            request.workers !== 'any' ? { workers: request.workers } : {})),
          secret.length ? `\n\n*** ${secret.join(', ')}: secret (its task redacts them)` : '');
        // A secret or withheld argument is not in the page to send again: the form asks for it instead.
        const whole = !secret.length && !request.omitted;
        $('#again').disabled = !whole;
        if (!whole) $('#again').title = 'Some arguments are not shown here (secret, or too large): use Edit and submit';
        $('#edit').hidden = false;
        renderSummary();
      } catch (e) {
        $('#args').textContent = e.status === 404 ? 'The API does not hold what this job was submitted with.' : e.message;
      }
    })();
  }

  window.zfab.views.job = jobView;
})();
