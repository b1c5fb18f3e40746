() => { const b = document.querySelector('#run');
  return b && b.disabled ? '<div class="pg-status pg-status-info pg-notice">' + __BUSY_MESSAGE__ + '</div>' : ''; }
