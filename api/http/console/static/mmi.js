/* zfab console: the queues (/ui/queues) and workers (/ui/workers) views, read from the broker's MMI. */
(() => {
  'use strict';

  const { $, now, h, fmtTime, fmtDur, fmtBytes, fmtNum, badge, api, every, ready } = window.zfab;

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
  /** Which broker answers the API (with brokers on a lease, the active one: the API follows it) and
   * its term, from show_broker's role, epoch, failovers and lease_age. A broker without a lease
   * (or one older than leases) says no role: it is the only one, "single". */
  function showBroker(broker) {
    const role = typeof broker.role === 'string' ? broker.role : 'single';
    const term = [broker.endpoint || ''];
    if (broker.epoch) term.push(`epoch ${fmtNum(broker.epoch)}`);
    if (broker.failovers) term.push(`took over ${fmtNum(broker.failovers)}×`);
    if (typeof broker.lease_age === 'number') term.push(`lease read ${broker.lease_age.toFixed(1)} s ago`);
    const el = $('#cards [data-k="broker"]');
    el.replaceChildren(h('span', { class: `badge role-${role}`, title: `this broker's role: ${role}` }, role),
      h('small', {}, ` ${term.filter(Boolean).join(' · ')}`));
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
      showBroker(broker);
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

  Object.assign(window.zfab.views, { queues: queuesView, workers: workersView });
  window.zfab.showBroker = showBroker;
})();
