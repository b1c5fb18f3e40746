(...args) => {
  const root = ((window.gradio_config && window.gradio_config.root) || (location.origin + location.pathname))
    .replace(/\/+$/, '');
  const post = (what, value) => fetch(root + '/playground_api/' + what, {method: 'POST',
    headers: {'Content-Type': 'application/json'}, body: JSON.stringify({value})});
  if (!window.__pgFlow) {
    window.__pgFlow = true;
    let last = '';
    let pending = false;
    const send = () => {
      pending = false;
      const f = document.querySelector('#status [data-frame]');
      const v = f ? f.getAttribute('data-frame') : '';
      if (!v || v === last) return;
      last = v;
      post('ack', v).catch(() => {});
    };
    // A frame counts as drawn once the browser is idle after it (laid out, painted, no task
    // waiting), or two seconds later in a page that is never idle: the next ones then cannot
    // crowd out a click. The whole page is watched and #status looked up each time, so a
    // status element Gradio re-creates is still followed.
    new MutationObserver(() => {
      if (pending) return;
      pending = true;
      if (window.requestIdleCallback) requestIdleCallback(send, {timeout: 2000}); else setTimeout(send, 50);
    }).observe(document.body, {childList: true, subtree: true, attributes: true, attributeFilter: ['data-frame']});
    // A figure Gradio takes out of the page stays in memory while plotly's window resize
    // handler holds it (one figure of ~300 nodes per run: 26.7 -> 40.3 MB of JS heap and
    // 6,500 -> 25,000 DOM nodes over 50 runs in one tab). Let go of the handler of every
    // figure that leaves the page, as Plotly.purge would.
    new MutationObserver((records) => {
      for (const r of records) {
        for (const n of r.removedNodes) {
          if (n.nodeType !== 1 || n.isConnected) continue;
          const figs = n.classList.contains('js-plotly-plot') ? [n] : n.querySelectorAll('.js-plotly-plot');
          for (const gd of figs) {
            if (gd._responsiveChartHandler) {
              window.removeEventListener('resize', gd._responsiveChartHandler);
              delete gd._responsiveChartHandler;
            }
          }
        }
      }
    }).observe(document.body, {childList: true, subtree: true});
    document.addEventListener('click', (e) => {
      const b = e.target && e.target.closest ? e.target.closest('#stop') : null;
      if (!b || b.disabled) return;
      const f = document.querySelector('#status [data-frame]');
      const v = f ? f.getAttribute('data-frame') : '';
      const tok = (window.__pgLive && window.__pgLive.tok) || v.slice(0, v.lastIndexOf(':'));
      if (tok) post('stop', tok).catch(() => {});
    }, true);
  }
  const bytes = crypto.getRandomValues(new Uint8Array(16));
  const tok = Array.from(bytes, (x) => x.toString(16).padStart(2, '0')).join('');
  // t: when this run's first token got where (performance.now(): this script ran, the first
  // poll left, the first answer of a known run came, the first answer with a lane came and was
  // patched in); server: the server's own marks, sent with that answer (live_feed.py)
  const live = window.__pgLive = {tok, seq: 0, seen: false, misses: 0, t: {flow: performance.now()}, server: null};
  // Patch one answer into the lanes. An append goes at the end of the lane's tokens only if
  // the element is still the one this run wrote (Gradio may have replaced it); otherwise the
  // next poll asks for every lane whole.
  const apply = (ans) => {
    let whole = false;
    for (const l of ans.lanes) {
      const k = l.lane + 1;
      const out = document.querySelector('#lane-' + k + '-output .tok-output');
      if (out) {
        if (l.op === 'append') {
          if (out.dataset.live === tok) out.insertAdjacentHTML('beforeend', l.html); else whole = true;
        } else {
          const box = out.parentElement;
          box.innerHTML = l.html;
          const mine = box.querySelector('.tok-output');
          if (mine) mine.dataset.live = tok;
        }
      } else whole = true;
      const st = document.querySelector('#lane-' + k + '-stats .lane-stats');
      if (st && st.parentElement) st.parentElement.innerHTML = l.stats;
    }
    return whole;
  };
  const POLL_HZ = 12;
  const poll = () => {
    if (window.__pgLive !== live) return;  // a newer run reads its own feed
    const asked = performance.now();
    if (live.t.poll === undefined) live.t.poll = asked;
    post('live', tok + ':' + live.seq).then((r) => r.json()).then((ans) => {
      // an answer that arrives after the run's last frame (sent before Stop) is stale
      if (window.__pgLive !== live || document.querySelector('#status [data-run-end="' + tok + '"]')) return;
      if (ans.unknown) {
        // not started yet (queued past the server's wait for a poll that overtook the Run,
        // page_routes.EARLY_WAIT_S), or over: a run once seen
        // has ended; one never seen is asked for again every 25 ms for its first two seconds
        // (the feed is the lanes' only text path, so this wait is part of the first token's),
        // then ten times a second, for about a minute (the server answers such a poll at once)
        if (!live.seen && ++live.misses < 600) setTimeout(poll, live.misses < 80 ? 25 : 100);
        return;
      }
      if (ans.busy) { setTimeout(poll, 100); return; }  // another poll of this run is being served
      if (!live.seen) live.t.known = performance.now();
      live.seen = true;
      if (ans.t) { live.t.answer = performance.now(); live.server = ans.t; }
      live.seq = apply(ans) ? -1 : ans.seq;
      if (ans.t) live.t.applied = performance.now();
      if (ans.done) return;
      // ask again once this answer is drawn, and not more than POLL_HZ times a second (a
      // hidden tab draws nothing and asks again when it is shown; the run's last frame
      // carries every lane whole)
      requestAnimationFrame(() => setTimeout(poll, Math.max(0, 1000 / POLL_HZ - (performance.now() - asked))));
    }).catch(() => { if (window.__pgLive === live && ++live.misses < 120) setTimeout(poll, 500); });
  };
  poll();
  args[args.length - 1] = 'flow:' + tok;
  return args;
}