(s) => {
  const v = Number(s);
  document.querySelectorAll('.tok.cur-step').forEach((e) => e.classList.remove('cur-step'));
  if (Number.isFinite(v)) {
    document.querySelectorAll('.tok[data-step="' + String(Math.trunc(v)) + '"]').forEach((e) => e.classList.add('cur-step'));
  }
  return [];
}
