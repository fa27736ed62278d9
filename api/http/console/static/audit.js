/* zfab console: the audit log (/ui/audit), from GET /audit: who changed what, when, from where, the outcome. */
(() => {
  'use strict';

  const { $, h, fmtTime, fmtNum, api, every, ready } = window.zfab;

  function auditView() {
    every(5000, async () => {
      const page = await api('/audit?limit=200');
      const rows = page.items.map((e) => h('tr', {},
        h('td', {}, fmtTime(e.at)),
        h('td', {}, e.actor),
        h('td', {}, e.role),
        h('td', {}, h('code', {}, e.action)),
        h('td', {}, e.target),
        h('td', {}, e.peer),
        h('td', { class: `num${e.status >= 400 ? ' bad' : ''}` }, String(e.status)),
      ));
      const tbody = $('#audit tbody');
      tbody.replaceChildren(...(rows.length ? rows : [h('tr', { class: 'empty' }, h('td', { colspan: 7 }, 'No state-changing call yet.'))]));
      $('#count').textContent = `${fmtNum(page.total)} entries`;
      $('#updated').textContent = `updated ${fmtTime(Date.now() / 1000)}`;
      ready();
    });
  }

  window.zfab.views.audit = auditView;
})();
