/* zfab console: the schedules view (/ui/schedules): pause, resume, delete, create. */
(() => {
  'use strict';

  const {
    ROOT, $, $$, enc, now, h, epochOf, fmtTime, fmtEvery, fmtNum, badge, tick, report, api, every, ready,
    jobForm, panel,
  } = window.zfab;

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
        type: 'button', class: 'small', dataset: { action: s.paused ? 'resume' : 'pause', needs: 'schedule' },
        onclick: () => act(() => api(`/schedules/${enc(s.id)}`, { method: 'PATCH', body: { paused: !s.paused } })),
      }, s.paused ? 'Resume' : 'Pause');
      const deleteBtn = h('button', { type: 'button', class: 'small danger', dataset: { action: 'delete', needs: 'schedule' } }, 'Delete');
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
        h('td', { class: 'num failures', title: s.last_error || '' }, fmtNum(s.failures),
          s.last_error ? h('div', { class: 'error last-error' }, s.last_error) : null),
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

  window.zfab.views.schedules = schedulesView;
})();
