/* zfab console: the jobs view (/ui): filters, pages, live readings, the submit form. */
(() => {
  'use strict';

  const {
    ROOT, PAGE_SIZE, FINAL, $, $$, enc, h, pad, epochOf, fmtTime, fmtDur, fmtNum, badge, target, jobLink,
    ticking, tick, report, api, every, ready, jobForm, panel,
  } = window.zfab;

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

  window.zfab.views.jobs = jobsView;
})();
