(p, mode) => {
  if (mode !== 'position') return [];  // the step scrubber's own highlight is in charge
  const v = Math.trunc(Number(p));
  document.querySelectorAll('.tok.cur-step').forEach((e) => e.classList.remove('cur-step'));
  if (Number.isFinite(v)) {
    document.querySelectorAll('.tok-output').forEach((o) => {
      const t = o.querySelectorAll('.tok')[v];
      if (t) t.classList.add('cur-step');
    });
  }
  return [];
}
