// The sluice dashboard: polls v1/stats, turns counters into rates, draws. No dependencies.
// Every value from the server is put in the page as text (never as HTML): keys come from
// clients.
(() => {
  'use strict';

  const HISTORY = 120; // points kept per chart
  const REASONS = ['limit', 'queue_full', 'timeout', 'capacity', 'unavailable', 'ambiguous_key'];
  const $ = (id) => document.getElementById(id);

  /** h('div', {class: 'x'}, child, 'text'): an element, children appended as nodes or text. */
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined) continue;
      if (k === 'class') el.className = v;
      else if (k === 'text') el.textContent = v;
      else el.setAttribute(k, v);
    }
    for (const c of children) el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return el;
  }

  const fmt = {
    int: (n) => (n === null || n === undefined ? '–' : Math.round(n).toLocaleString('en-US')),
    rate: (r) => {
      if (r === null || r === undefined || !isFinite(r)) return '–';
      if (r === 0) return '0';
      if (r < 10) return r.toFixed(2);
      if (r < 100) return r.toFixed(1);
      return Math.round(r).toLocaleString('en-US');
    },
    ms: (ms) => {
      if (ms === null || ms === undefined) return '–';
      if (ms === 0) return '0 ms';
      if (ms >= 10000) return (ms / 1000).toFixed(0) + ' s';
      if (ms >= 1000) return (ms / 1000).toFixed(1) + ' s';
      if (ms >= 10) return ms.toFixed(0) + ' ms';
      return ms.toFixed(1) + ' ms';
    },
    pct: (x) => (x === null || !isFinite(x) ? '–' : (100 * x).toFixed(x < 0.1 ? 1 : 0) + '%'),
  };

  const state = {
    prev: null, // the last snapshot
    intervalMs: 1000,
    paused: false,
    timer: null,
    cards: new Map(), // policy name -> {root, refs, history}
    jobsAt: 0, // when v1/jobs was last read
  };
  // For tests and the curious: the latest snapshot and how many polls succeeded.
  const view = (window.sluiceDashboard = { polls: 0, errors: 0, last: null, rates: {}, jobs: null });

  const sum = (o) => Object.values(o || {}).reduce((a, b) => a + (b || 0), 0);

  function rateOf(now, before, dtS) {
    if (before === undefined || before === null || dtS <= 0) return null;
    return Math.max(0, (now - before) / dtS);
  }

  // === one policy card ===

  function makeCard(p) {
    const refs = {};
    const figure = (cls, label, key) => {
      refs[key] = h('div', { class: 'value ' + key });
      refs[key + 'Sub'] = h('div', { class: 'sub' });
      return h('div', { class: 'figure ' + cls }, h('div', { class: 'label', text: label }), refs[key], refs[key + 'Sub']);
    };
    refs.quota = h('div', { class: 'quota' });
    refs.reasons = h('div', { class: 'reasons' });
    refs.canvas = h('canvas', { 'aria-label': 'admitted and denied per second' });
    refs.keys = h('tbody');
    refs.keysNote = h('div', { class: 'empty-note', text: 'No key holds fewer tokens than a full bucket right now.' });
    refs.overrides = h('tbody');
    refs.overridesNote = h('div', { class: 'empty-note', text: 'No key has a quota of its own.' });
    const root = h(
      'article',
      { class: 'card policy', 'data-policy': p.name },
      h('div', { class: 'policy-head' }, h('h2', { text: p.name }), h('span', { class: 'badge', text: p.algorithm }), h('span', { class: 'badge', text: p.store })),
      refs.quota,
      h(
        'div',
        { class: 'figures' },
        figure('ok', 'admitted / s', 'admittedRate'),
        figure('bad', 'denied / s', 'deniedRate'),
        figure('wait', 'waiting now', 'waiting'),
        figure('', 'queue wait p50 · p99', 'queueWait'),
      ),
      refs.reasons,
      h(
        'div',
        { class: 'chart' },
        refs.canvas,
        h('div', { class: 'legend' }, h('span', {}, h('i', { style: 'background: var(--ok)' }), 'admitted'), h('span', {}, h('i', { style: 'background: var(--bad)' }), 'denied')),
      ),
      h('div', { class: 'sub-h', text: 'hottest keys (fewest tokens left)' }),
      h(
        'table',
        { class: 'grid keys' },
        h('thead', {}, h('tr', {}, h('th', { text: 'key' }), h('th', { text: 'bucket level' }), h('th', { class: 'num', text: 'tokens' }), h('th', { class: 'num', text: 'full in' }))),
        refs.keys,
      ),
      refs.keysNote,
      h('div', { class: 'sub-h', text: 'keys with a quota of their own' }),
      h(
        'table',
        { class: 'grid overrides' },
        h('thead', {}, h('tr', {}, h('th', { text: 'key' }), h('th', { class: 'num', text: 'capacity' }), h('th', { class: 'num', text: 'rate' }))),
        refs.overrides,
      ),
      refs.overridesNote,
    );
    return { root, refs, history: [] };
  }

  function describeQuota(p) {
    const parts = [`capacity ${p.capacity} at ${p.rate}`, `key ${p.key}`];
    parts.push(p.queue ? `queue ${p.queue.depth} per key, ≤ ${fmt.ms(p.queue.max_wait_ms)}` : 'no queue (deny at once)');
    if (p.concurrency) parts.push(`at most ${p.concurrency} in flight`);
    return parts.join(' · ');
  }

  function updateCard(card, p, before, dtS) {
    const r = card.refs;
    r.quota.textContent = describeQuota(p);
    const denied = sum(p.denied);
    const admittedRate = rateOf(p.admitted, before && before.admitted, dtS);
    const deniedRate = before ? rateOf(denied, sum(before.denied), dtS) : null;
    view.rates[p.name] = { admitted: admittedRate, denied: deniedRate };
    r.admittedRate.textContent = fmt.rate(admittedRate);
    r.admittedRateSub.textContent = `${fmt.int(p.admitted)} in all`;
    r.deniedRate.textContent = fmt.rate(deniedRate);
    r.deniedRateSub.textContent = `${fmt.int(denied)} in all`;
    r.waiting.textContent = fmt.int(p.waiting);
    r.waitingSub.textContent = p.in_flight !== null && p.in_flight !== undefined ? `${p.in_flight} / ${p.concurrency} in flight` : p.queue ? `max ${p.queue.depth} per key` : 'no queue';
    const qw = p.queue_wait_ms;
    r.queueWait.textContent = qw && qw.count > 0 ? `${fmt.ms(qw.p50)} · ${fmt.ms(qw.p99)}`.replace(/ ms · /, ' · ') : '–';
    r.queueWaitSub.textContent = qw ? `${fmt.int(qw.count)} waited` : 'nobody waited yet';
    card.root.dataset.admitted = String(p.admitted);
    card.root.dataset.denied = String(denied);

    r.reasons.replaceChildren();
    for (const reason of REASONS) {
      const n = p.denied[reason] || 0;
      if (n === 0) continue;
      const rr = before ? rateOf(n, before.denied[reason] || 0, dtS) : null;
      r.reasons.append(h('span', { class: 'chip', title: `denied for ${reason}` }, `${reason} ${fmt.int(n)}${rr ? ` · ${fmt.rate(rr)}/s` : ''}`));
    }
    if (!r.reasons.childElementCount) r.reasons.append(h('span', { class: 'chip quiet', text: 'no denials yet' }));

    if (admittedRate !== null) {
      card.history.push({ ok: admittedRate, bad: deniedRate || 0 });
      if (card.history.length > HISTORY) card.history.shift();
    }
    drawChart(r.canvas, card.history);

    r.keys.replaceChildren();
    for (const k of p.hottest) {
      const level = Math.max(0, Math.min(1, k.level));
      const barClass = level < 0.05 ? 'bar empty' : level < 0.3 ? 'bar low' : 'bar';
      r.keys.append(
        h(
          'tr',
          { class: 'key-row' },
          h('td', { class: 'key', title: k.key, text: k.key }),
          h('td', {}, h('div', { class: barClass }, h('span', { style: `width: ${(level * 100).toFixed(1)}%` }))),
          h('td', { class: 'num', text: `${k.tokens.toFixed(k.tokens < 10 ? 1 : 0)} / ${k.limit}` }),
          h('td', { class: 'num', text: fmt.ms(k.reset_after_ms) }),
        ),
      );
    }
    r.keysNote.hidden = p.hottest.length > 0;

    r.overrides.replaceChildren();
    for (const o of p.overrides || []) {
      r.overrides.append(
        h(
          'tr',
          { class: 'override-row' },
          h('td', { class: 'key', title: o.key, text: o.key }),
          h('td', { class: 'num', text: fmt.int(o.capacity) }),
          h('td', { class: 'num', text: o.rate }),
        ),
      );
    }
    r.overridesNote.textContent = p.overrides ? 'No key has a quota of its own.' : 'The store did not answer.';
    r.overridesNote.hidden = Boolean(p.overrides && p.overrides.length);
  }

  function drawChart(canvas, points) {
    const dpr = window.devicePixelRatio || 1;
    const w = canvas.clientWidth;
    const hgt = canvas.clientHeight;
    if (!w || !hgt) return;
    if (canvas.width !== Math.round(w * dpr) || canvas.height !== Math.round(hgt * dpr)) {
      canvas.width = Math.round(w * dpr);
      canvas.height = Math.round(hgt * dpr);
    }
    const ctx = canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, hgt);
    const css = getComputedStyle(document.documentElement);
    const top = Math.max(1, ...points.map((p) => Math.max(p.ok, p.bad)));
    const step = w / (HISTORY - 1);
    const x0 = w - (points.length - 1) * step;
    const base = hgt - 15; // room for the time labels below
    const y = (v) => base - (base - 14) * (v / top);
    ctx.font = '11px system-ui, sans-serif';
    ctx.fillStyle = css.getPropertyValue('--muted');
    ctx.fillText(`${fmt.rate(top)}/s`, 2, 10);
    const span = Math.round((HISTORY * state.intervalMs) / 60000);
    ctx.fillText(`${span} min ago`, 2, hgt - 2);
    ctx.textAlign = 'right';
    ctx.fillText('now', w - 2, hgt - 2);
    ctx.textAlign = 'left';
    ctx.strokeStyle = css.getPropertyValue('--line');
    ctx.lineWidth = 1;
    ctx.beginPath();
    ctx.moveTo(0, base + 0.5);
    ctx.lineTo(w, base + 0.5);
    ctx.stroke();
    ctx.setLineDash([3, 3]);
    ctx.beginPath();
    ctx.moveTo(0, y(top));
    ctx.lineTo(w, y(top));
    ctx.stroke();
    ctx.setLineDash([]);
    if (points.length < 2) return;
    const series = (key, stroke, fill) => {
      ctx.beginPath();
      points.forEach((p, i) => (i ? ctx.lineTo(x0 + i * step, y(p[key])) : ctx.moveTo(x0, y(p[key]))));
      ctx.strokeStyle = stroke;
      ctx.lineWidth = 1.8;
      ctx.stroke();
      ctx.lineTo(x0 + (points.length - 1) * step, base);
      ctx.lineTo(x0, base);
      ctx.closePath();
      ctx.fillStyle = fill;
      ctx.fill();
    };
    series('ok', css.getPropertyValue('--ok'), css.getPropertyValue('--ok-soft'));
    series('bad', css.getPropertyValue('--bad'), css.getPropertyValue('--bad-soft'));
  }

  // === routes and browser telemetry ===

  function renderRoutes(routes, before, dtS) {
    const body = $('routes').tBodies[0];
    body.replaceChildren();
    const prev = new Map((before || []).map((r) => [r.route, r]));
    for (const r of routes) {
      const total = sum(r.responses) + sum(r.errors);
      const b = prev.get(r.route);
      const rate = b ? rateOf(total, sum(b.responses) + sum(b.errors), dtS) : null;
      body.append(
        h(
          'tr',
          {},
          h('td', { class: 'key', text: r.route }),
          h('td', { text: r.policies.length ? r.policies.join(', ') : 'unlimited' }),
          h('td', { class: 'num', text: fmt.int(r.responses['2xx'] || 0) }),
          h('td', { class: 'num', text: fmt.int(r.responses['4xx'] || 0) }),
          h('td', { class: 'num', text: fmt.int(r.responses['5xx'] || 0) }),
          h('td', { class: 'num', text: fmt.int(sum(r.errors)) }),
          h('td', { class: 'num', text: fmt.rate(rate) }),
        ),
      );
    }
  }

  function renderBrowser(metrics, before, dtS) {
    const box = $('browser');
    box.replaceChildren();
    if (!metrics.length) {
      box.append(h('div', { class: 'empty-note', text: 'No browser telemetry reported yet. Service Workers that send telemetry to this gateway show up here.' }));
      return;
    }
    const id = (m) => m.name + JSON.stringify(m.labels);
    const prev = new Map((before || []).map((m) => [id(m), m.value]));
    const tbody = h('tbody');
    for (const m of metrics) {
      const labels = Object.entries(m.labels).map(([k, v]) => `${k}=${v}`).join(', ');
      const rate = m.name.endsWith('_total') || m.name.endsWith('_count') ? rateOf(m.value, prev.get(id(m)), dtS) : null;
      tbody.append(
        h('tr', { class: 'browser-row' }, h('td', { class: 'key', text: m.name.replace(/^sluice_browser_/, '') }), h('td', { text: labels }), h('td', { class: 'num', text: Number.isInteger(m.value) ? fmt.int(m.value) : fmt.rate(m.value) }), h('td', { class: 'num', text: rate === null ? '' : `${fmt.rate(rate)}/s` })),
      );
    }
    box.append(h('table', { class: 'grid' }, h('thead', {}, h('tr', {}, h('th', { text: 'metric' }), h('th', { text: 'labels' }), h('th', { class: 'num', text: 'value' }), h('th', { class: 'num', text: 'rate' }))), tbody));
  }

  // === job queues ([jobs]) ===

  const JOB_FIGURES = ['waiting', 'delayed', 'active', 'dead', 'completed', 'failed', 'retried'];

  function renderJobs(doc) {
    const box = $('jobs-queues');
    box.replaceChildren();
    for (const q of doc.queues) {
      box.append(h('div', { class: 'queue-h', text: `queue ${q.name}` }));
      if (q.error) {
        box.append(h('div', { class: 'empty-note', text: `Redis did not answer: ${q.error}` }));
        continue;
      }
      if (!q.groups.length) {
        box.append(h('div', { class: 'empty-note', text: 'No group has had a job yet.' }));
        continue;
      }
      const tbody = h('tbody');
      const row = (cls, name, f) => h('tr', { class: cls, 'data-queue': q.name, 'data-group': name }, h('td', { class: 'key', title: name, text: name }), ...JOB_FIGURES.map((k) => h('td', { class: 'num ' + k, text: fmt.int(f[k]) })));
      for (const g of q.groups) tbody.append(row('job-row', g.group, g));
      if (q.groups.length > 1) tbody.append(row('job-total', 'all shown', q.total));
      const head = h('tr', {}, h('th', { text: 'group' }), ...JOB_FIGURES.map((k) => h('th', { class: 'num', text: k })));
      box.append(h('table', { class: 'grid job-groups' }, h('thead', {}, head), tbody));
      if (q.groups_total > q.groups.length) box.append(h('div', { class: 'empty-note', text: `${q.groups_total - q.groups.length} more groups not shown (sluice jobs inspect lists them all).` }));
    }
    $('jobs-hint').textContent = `[jobs]: each group's jobs, read from Redis every ${fmt.ms(Math.max(2000, doc.interval_ms || 0))}`;
    view.jobs = doc;
  }

  // Read at most every jobs.interval (and not more often than every 2 s): each read asks
  // Redis for every group's figures.
  async function pollJobs(jobs) {
    const section = $('jobs');
    section.hidden = !jobs;
    if (!jobs) return;
    const every = Math.max(2000, jobs.interval_ms || 0);
    if (state.jobsAt && Date.now() - state.jobsAt < every) return;
    state.jobsAt = Date.now();
    try {
      const response = await fetch('v1/jobs', { cache: 'no-store' });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      renderJobs(await response.json());
    } catch (e) {
      $('jobs-hint').textContent = `no answer from v1/jobs (${e.message})`;
    }
  }

  // === the whole page ===

  function render(snap) {
    const before = state.prev;
    const dtS = before ? (snap.now_ms - before.now_ms) / 1000 : 0;
    $('config').textContent = snap.config;
    const prevPolicies = new Map((before ? before.policies : []).map((p) => [p.name, p]));
    const container = $('policies');
    const seen = new Set();
    // A request admitted by every policy of its route reaches the upstream once; a denied one
    // is counted by the one policy that denied it. So: admitted from the limited routes'
    // upstream answers, denied from the policies.
    const passed = (routes) => (routes || []).filter((r) => r.policies.length).reduce((n, r) => n + sum(r.responses) + sum(r.errors), 0);
    const admitted = passed(snap.routes);
    const admittedBefore = before ? passed(before.routes) : 0;
    let denied = 0, deniedBefore = 0, waiting = 0, inFlight = 0, slots = 0;
    for (const p of snap.policies) {
      seen.add(p.name);
      let card = state.cards.get(p.name);
      if (!card) {
        card = makeCard(p);
        state.cards.set(p.name, card);
        container.append(card.root);
      }
      const b = prevPolicies.get(p.name);
      updateCard(card, p, b, dtS);
      denied += sum(p.denied);
      if (b) deniedBefore += sum(b.denied);
      waiting += p.waiting;
      if (p.concurrency) {
        inFlight += p.in_flight || 0;
        slots += p.concurrency;
      }
    }
    for (const [name, card] of state.cards) {
      if (!seen.has(name)) {
        card.root.remove();
        state.cards.delete(name);
      }
    }
    const note = container.querySelector(':scope > .empty-note');
    if (!snap.policies.length && !note) {
      container.append(h('div', { class: 'card empty-note', text: 'This configuration has no policy: every route is unlimited.' }));
    } else if (snap.policies.length && note) {
      note.remove();
    }
    const aRate = before ? rateOf(admitted, admittedBefore, dtS) : null;
    const dRate = before ? rateOf(denied, deniedBefore, dtS) : null;
    $('t-admitted-rate').textContent = fmt.rate(aRate);
    $('t-admitted').textContent = `${fmt.int(admitted)} in all`;
    $('t-denied-rate').textContent = fmt.rate(dRate);
    $('t-denied').textContent = `${fmt.int(denied)} in all`;
    const decided = (aRate || 0) + (dRate || 0);
    $('t-share').textContent = before && decided > 0 ? fmt.pct(dRate / decided) : '–';
    $('t-share-total').textContent = admitted + denied > 0 ? `${fmt.pct(denied / (admitted + denied))} since start` : '';
    $('t-waiting').textContent = fmt.int(waiting);
    $('t-inflight').textContent = slots ? `${inFlight} / ${slots} concurrency slots busy` : '';
    renderRoutes(snap.routes, before && before.routes, dtS);
    renderBrowser(snap.browser, before && before.browser, dtS);
    state.prev = snap;
    view.last = snap;
    view.polls += 1;
  }

  function setStatus(kind, text) {
    $('dot').className = 'dot ' + kind;
    $('status').textContent = text;
  }

  async function poll() {
    state.timer = null;
    if (state.paused) return;
    try {
      const response = await fetch('v1/stats', { cache: 'no-store' });
      if (!response.ok) throw new Error(`HTTP ${response.status}`);
      const snap = await response.json();
      render(snap);
      await pollJobs(snap.jobs);
      setStatus('on', `live · ${new Date().toLocaleTimeString()}`);
    } catch (e) {
      view.errors += 1;
      setStatus('off', `no answer (${e.message}); retrying`);
    }
    if (!state.paused) state.timer = setTimeout(poll, state.intervalMs);
  }

  $('interval').addEventListener('change', (e) => {
    state.intervalMs = Number(e.target.value) || 1000;
  });
  $('pause').addEventListener('click', () => {
    state.paused = !state.paused;
    $('pause').textContent = state.paused ? 'Resume' : 'Pause';
    if (state.paused) {
      if (state.timer) clearTimeout(state.timer);
      state.timer = null;
      setStatus('paused', 'paused');
    } else {
      state.prev = null; // a rate across the pause would mislead
      poll();
    }
  });
  window.addEventListener('resize', () => {
    for (const card of state.cards.values()) drawChart(card.refs.canvas, card.history);
  });
  poll();
})();
