(f) => {
  const v = Number(f) || 0;
  let s = document.getElementById('pg-focus-style');
  if (!s) {
    s = document.createElement('style');
    s.id = 'pg-focus-style';
    document.head.appendChild(s);
  }
  const others = [];
  document.querySelectorAll('#inspector .inspect-col').forEach((e) => {
    if (v > 0 && e.id !== 'inspect-' + v) others.push('#' + e.id);
  });
  s.textContent = others.length ? others.join(', ') + ' { display: none !important; }' : '';
  setTimeout(() => window.dispatchEvent(new Event('resize')), 50);
  return [];
}
