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
