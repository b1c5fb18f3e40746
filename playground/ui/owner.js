() => {
  // The browser's owner key (playground/ownership.py): made once, kept in local storage, sent
  // with the events that save or change sessions. The server stores only its hash. Where local
  // storage is refused (some embedded frames) the key lasts as long as the page.
  const NAME = 'decoder-playground-owner';
  let key = null;
  try { key = window.localStorage.getItem(NAME); } catch (e) { key = window.__pgOwnerKey || null; }
  if (!key || !/^[A-Za-z0-9_-]{32,128}$/.test(key)) {
    const bytes = crypto.getRandomValues(new Uint8Array(24));
    key = Array.from(bytes, (x) => x.toString(16).padStart(2, '0')).join('');
    try { window.localStorage.setItem(NAME, key); } catch (e) { window.__pgOwnerKey = key; }
  }
  return key;
}
