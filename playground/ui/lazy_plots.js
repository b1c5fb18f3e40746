() => {
  // Plots drawn on sight. Gradio's Plot component hands each figure to Plotly.react as soon as
  // its value arrives; a replayed showdown sends some 26 at once, all below the fold, and
  // drawing them took most of the replay (~200 ms of plotly per figure, one after the other,
  // before the page answered a click). Here a plot's first drawing waits until it comes near
  // the viewport (or is opened: a closed accordion's or hidden tab's plot is out of view);
  // the newest figure sent meanwhile is the one drawn. Shortly after the last figure came in
  // (or the last plot was drawn on sight), the plots still waiting are drawn one per task,
  // nearest first: the page answers clicks and scrolls between two of them, a plot scrolled to
  // jumps the queue, and every figure is drawn about as soon as before (so a page read by a
  // script, screenshots or tests, gets them all). A plot already drawn is redrawn at once, as
  // before.
  if (window.__pgLazyPlots) return [];
  const MARGIN_PX = 200;  // start a little before the plot scrolls in
  const QUIET_MS = 150;  // after the last figure or on-sight drawing, the rest are drawn
  const DEFAULT_HEIGHT_PX = 450;  // plotly's, for a figure that sets none
  const state = window.__pgLazyPlots = {held: new Map()};
  let quiet = null;
  let react = null;
  const draw = (gd) => {
    const args = state.held.get(gd);
    state.held.delete(gd);
    seen.unobserve(gd);
    if (!args || !gd.isConnected) return;
    gd.style.minHeight = '';
    react(gd, ...args).then(() => window.Plotly.Plots.resize(gd)).catch(() => {});
  };
  const drain = () => {
    quiet = null;
    const waiting = [...state.held.keys()].filter((gd) => gd.isConnected);
    for (const gd of state.held.keys()) if (!gd.isConnected) { state.held.delete(gd); seen.unobserve(gd); }
    if (!waiting.length) return;
    const away = (gd) => { const r = gd.getBoundingClientRect();
      return r.width || r.height ? Math.abs(r.top + r.height / 2 - innerHeight / 2) : Infinity; };
    waiting.sort((a, b) => away(a) - away(b));
    draw(waiting[0]);
    // the next in a task of its own: a click or a scroll waiting is handled in between (and a
    // plot scrolled to is drawn next), with no idle gap between two drawings (waiting for an
    // idle moment each time made every plot of a replayed showdown 3.7 s later)
    if (waiting.length > 1) setTimeout(drain, 0);
  };
  const later = () => { if (quiet !== null) clearTimeout(quiet); quiet = setTimeout(drain, QUIET_MS); };
  const seen = new IntersectionObserver((entries) => {
    for (const e of entries) if (e.isIntersecting && state.held.has(e.target)) draw(e.target);
    later();
  }, {rootMargin: MARGIN_PX + 'px 0px'});
  const patch = (P) => {
    if (!P || P.__pgLazy || typeof P.react !== 'function') return;
    P.__pgLazy = true;
    react = P.react.bind(P);
    const resize = P.Plots && P.Plots.resize ? P.Plots.resize.bind(P.Plots) : null;
    P.react = (gd, ...args) => {
      // held even in view: the observer says so on the next frame, without the forced
      // layout that measuring each plot in a page still being built would cost
      if (!(gd instanceof Element) || gd._fullLayout) {
        state.held.delete(gd);
        return react(gd, ...args);
      }
      if (!state.held.has(gd)) seen.observe(gd);
      state.held.set(gd, args);  // the newest figure for this plot wins
      // the place the figure will take: an empty plot has no height, and a page of collapsed
      // plots would bring them all into view at once (and jump as they are drawn)
      const layout = args[1] || {};
      gd.style.minHeight = (Number(layout.height) || DEFAULT_HEIGHT_PX) + 'px';
      later();
      return Promise.resolve(gd);
    };
    // Gradio resizes every plot it hands over; one still waiting has nothing to resize
    if (resize) P.Plots.resize = (gd) => (state.held.has(gd) ? Promise.resolve(gd) : resize(gd));
  };
  if (window.Plotly) patch(window.Plotly);
  else {
    // plotly.js is loaded with the first figure and announces itself as window.Plotly
    let P;
    Object.defineProperty(window, 'Plotly', {configurable: true, enumerable: true,
      get: () => P, set: (v) => { P = v; patch(v); }});
  }
  return [];
}
