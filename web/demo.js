// The demo page: registers the worker, fires requests from this tab, shows the shared bucket.
import { register } from './client.js';

const $ = (id) => document.getElementById(id);
const tab = { sent: 0, ok: 0, limited: 0, other: 0, waits: [] };
let timer = null;
let seq = 0;

function fireOne() {
  const start = performance.now();
  tab.sent++;
  fetch(`${$('path').value}/${++seq}`, { cache: 'no-store' })
    .then((res) => {
      if (res.status === 200) {
        tab.ok++;
        tab.waits.push(performance.now() - start);
        if (tab.waits.length > 200) tab.waits.shift();
      } else if (res.status === 429) tab.limited++;
      else tab.other++;
      return res.body && res.body.cancel();
    })
    .catch(() => tab.other++);
}

function toggle() {
  if (timer !== null) {
    clearInterval(timer);
    timer = null;
    $('toggle').textContent = 'Start';
    return;
  }
  const perSecond = Math.min(200, Math.max(0.1, Number($('rate').value) || 1));
  timer = setInterval(fireOne, 1000 / perSecond);
  $('toggle').textContent = 'Stop';
}

function median(xs) {
  if (!xs.length) return null;
  const s = [...xs].sort((a, b) => a - b);
  return s[s.length >> 1];
}

async function refresh() {
  $('sent').textContent = tab.sent;
  $('ok').textContent = tab.ok;
  $('limited').textContent = tab.limited;
  $('other').textContent = tab.other;
  const m = median(tab.waits);
  $('wait').textContent = m === null ? '–' : `${Math.round(m)} ms`;
  try {
    const st = await (await fetch('/sluice/state', { cache: 'no-store' })).json();
    if (st.disabled) $('error').textContent = `limiting disabled: ${st.disabled}`;
    const bucket = $('bucket');
    if (bucket.childElementCount !== st.capacity) {
      bucket.replaceChildren(...Array.from({ length: Math.min(st.capacity, 200) }, () => document.createElement('span')));
    }
    [...bucket.children].forEach((el, i) => (el.className = i < st.tokens ? 'token full' : 'token'));
    $('tokens').textContent = `${st.tokens} / ${st.capacity}` + (st.tokens < st.capacity ? ` (full in ${(st.reset_after_ms / 1000).toFixed(1)} s)` : '');
    $('queued').textContent = st.queued;
    $('tabs').textContent = st.flows;
    $('admitted').textContent = st.totals.admitted;
    $('r-full').textContent = st.totals.rejected.queue_full;
    $('r-timeout').textContent = st.totals.rejected.timeout;
    $('ratecfg').textContent = `${st.config.rate}, capacity ${st.config.capacity}`;
    $('depth').textContent = st.config.queue.depth;
    $('maxwait').textContent = `${st.config.queue.max_wait_ms} ms`;
    $('worker').textContent = st.worker;
    $('restored').textContent = st.restored_from;
  } catch (e) {
    // the worker is restarting; try again at the next tick
  }
}

register()
  .then(() => {
    $('toggle').disabled = false;
    $('toggle').addEventListener('click', toggle);
    setInterval(refresh, 250);
    refresh();
  })
  .catch((e) => ($('error').textContent = e.message));
