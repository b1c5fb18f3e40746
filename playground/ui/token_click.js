element.addEventListener('click', (ev) => {
  const t = ev.target.closest('.tok[data-step]');
  if (!t || !element.contains(t)) return;
  const step = parseInt(t.dataset.step, 10);
  if (Number.isNaN(step)) return;
  // pos: the token's place in this lane's output (the inspector's token-position alignment)
  const pos = Array.prototype.indexOf.call(element.querySelectorAll('.tok'), t);
  trigger('click', {step: step, lane: parseInt(t.dataset.lane || '0', 10), pos: pos});
});

// Follow the newest token unless the reader scrolled up. Every update replaces the output's
// HTML (and with it the scrolling box), so the position is kept here and restored.
const follow = {on: true, top: 0};
element.addEventListener('scroll', (ev) => {
  const b = ev.target;
  if (!b.classList || !b.classList.contains('tok-output')) return;
  follow.on = b.scrollHeight - b.scrollTop - b.clientHeight < 24;
  follow.top = b.scrollTop;
}, true);
new MutationObserver(() => {
  const b = element.querySelector('.tok-output');
  if (!b) return;
  if (b.querySelector('.tok-empty')) { follow.on = true; follow.top = 0; }
  b.scrollTop = follow.on ? b.scrollHeight : follow.top;
}).observe(element, {childList: true, subtree: true});

// A hand on the canvas. A click on a masked cell of a diffusion lane — in the lane's output, or
// in its canvas view (a masked cell, or one its plan committed at the step shown) — sends a
// `select` event {lane, step, pos, hand} instead of moving the scrubber: the branch panel pauses
// that lane at the step (the view's; the scrubber's for the output) and ticks or unticks the
// position in #branch-canvas-positions (the server checks the step offers it). Every other click
// goes on as above. The chosen cells are marked (.hand-pick) while the panel shows the lane
// paused (#branch-where's .branch-canvas-where names the lane and step). Each lane output keeps
// its own trigger; the document listener and the marker are set up once.
const hand = window.pgCanvasHand = window.pgCanvasHand || {fire: {}};
const own = element.closest('[id^="lane-"][id$="-output"]');
if (own) hand.fire[parseInt(own.id.slice(5), 10)] = trigger;
if (!hand.ready) {
  hand.ready = true;
  // the cell's lane (1-based) and the step it shows (null: the scrubber's), or null
  const cellOf = (t) => {
    const out = t.closest('[id^="lane-"][id$="-output"]');
    if (out && t.classList.contains('mask')) return {lane: parseInt(out.id.slice(5), 10), step: null};
    const view = t.closest('[id^="inspect-"][id$="-step-html"]');
    if (view && t.closest('.canvas-view') && (t.classList.contains('mask') || t.classList.contains('new'))) {
      return {lane: parseInt(view.id.slice(8), 10), step: parseInt(t.dataset.step, 10)};
    }
    return null;
  };
  document.addEventListener('click', (ev) => {
    const t = ev.target.closest && ev.target.closest('.tok[data-pos]');
    const c = t && cellOf(t);
    if (!c || !hand.fire[c.lane] || Number.isNaN(c.step)) return;
    ev.stopPropagation();
    ev.preventDefault();
    hand.fire[c.lane]('select', {lane: c.lane, step: c.step, pos: parseInt(t.dataset.pos, 10), hand: true});
  }, true);
  const paused = () => {
    const w = document.querySelector('#branch-where .branch-canvas-where');
    if (!w) return null;
    const chosen = new Set();
    document.querySelectorAll('#branch-canvas-positions input[type=checkbox][name]:checked').forEach((i) => {
      chosen.add(parseInt(i.name, 10));
    });
    const at = /position (\d+)/.exec((document.querySelector('#branch-canvas-at input') || {}).value || '');
    if (at) chosen.add(parseInt(at[1], 10));
    return {lane: parseInt(w.dataset.lane, 10) + 1, step: parseInt(w.dataset.step, 10), chosen: chosen};
  };
  const mark = () => {
    hand.queued = false;
    const p = paused();
    document.querySelectorAll('.tok[data-pos]').forEach((t) => {
      const c = p && p.chosen.has(parseInt(t.dataset.pos, 10)) && cellOf(t);
      const on = !!c && c.lane === p.lane && (c.step === null || c.step === p.step);
      if (t.classList.contains('hand-pick') !== on) t.classList.toggle('hand-pick', on);
    });
  };
  const later = () => {
    if (!hand.queued) { hand.queued = true; requestAnimationFrame(mark); }
  };
  // re-mark when a view is redrawn or the panel's ticks change (a tick toggles its label's class)
  new MutationObserver(later).observe(document.body, {childList: true, subtree: true, attributes: true,
                                                      attributeFilter: ['class', 'data-step']});
  document.addEventListener('change', later, true);
  document.addEventListener('input', later, true);
  const css = document.createElement('style');
  css.textContent = '.tok.hand-pick{outline:2px solid #2563eb !important;outline-offset:0;' +
                    'background:rgba(37,99,235,0.22) !important;color:inherit !important}';
  document.head.appendChild(css);
}
