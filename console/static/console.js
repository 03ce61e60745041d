// beatd console: the admin token (held in this tab's sessionStorage), the
// action buttons, relative times and the live updates (Server-Sent Events).
// The page works without it, read-only. Reading, where tokens guard it,
// rests on the sign-in form's HttpOnly cookie, which this script never
// sees.
(function () {
  'use strict';
  var KEY = 'beatd-admin-token';
  var body = document.body;

  function token() {
    try { return sessionStorage.getItem(KEY) || ''; } catch (e) { return ''; }
  }
  function setToken(t) {
    try {
      if (t) { sessionStorage.setItem(KEY, t); } else { sessionStorage.removeItem(KEY); }
    } catch (e) { /* storage disabled: actions stay disabled */ }
    applyAuth();
  }

  // Buttons are aria-disabled rather than disabled so they stay focusable
  // and their reason can be read; a click on one says why.
  function reason() {
    if (body.dataset.admin !== 'on') {
      return 'Disabled: this replica has no tokens configured (--tokens-file, or --admin-token-file / BEATD_ADMIN_TOKEN), so it refuses admin actions.';
    }
    if (!token()) {
      return 'Disabled: enter a token (operate or admin role) at the top of the page to trigger, pause, resume or backfill.';
    }
    return '';
  }
  function applyAuth() {
    var why = reason();
    var buttons = document.querySelectorAll('button[data-op], button[data-bf]');
    for (var i = 0; i < buttons.length; i++) {
      var b = buttons[i];
      if (why) {
        b.setAttribute('aria-disabled', 'true');
        b.title = why;
      } else {
        b.removeAttribute('aria-disabled');
        b.removeAttribute('title');
      }
    }
    var whyEl = document.getElementById('action-why');
    if (whyEl) { whyEl.textContent = why; }
    var st = document.getElementById('token-state');
    if (st) {
      st.textContent = token() ? 'Set for this tab only.' : 'Not set: trigger, pause and resume are disabled.';
    }
  }

  var words = { trigger: 'Trigger', pause: 'Pause', resume: 'Resume' };
  function act(b) {
    var msg = document.getElementById('action-msg');
    var op = b.dataset.op, name = b.dataset.entry;
    var why = reason();
    if (why) {
      msg.className = 'bad';
      msg.textContent = 'Refused, not sent. ' + why;
      return;
    }
    msg.className = '';
    msg.textContent = words[op] + ': sending…';
    var noteEl = document.getElementById('action-note');
    fetch('/entries/' + encodeURIComponent(name) + '/' + op, {
      method: 'POST',
      headers: { 'Authorization': 'Bearer ' + token(), 'Content-Type': 'application/json', 'X-Beatd-Client': 'console' },
      body: JSON.stringify({ note: noteEl ? noteEl.value : '' }),
      credentials: 'omit',
      cache: 'no-store'
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (j) { return { status: r.status, body: j }; });
    }).then(function (res) {
      if (res.status === 202) {
        msg.className = 'ok';
        msg.textContent = words[op] + ' accepted (request ' + res.body.request + '); the leader acts on it within a second.';
        return;
      }
      msg.className = 'bad';
      var detail = errorText(res);
      if (res.status === 401) {
        msg.textContent = 'Refused (401): the token is missing or unknown. ' + detail + '.';
      } else if (res.status === 403) {
        msg.textContent = 'Refused (403): ' + detail + '.';
      } else {
        msg.textContent = words[op] + ' failed (' + res.status + '): ' + detail + '.';
      }
    }).catch(function (e) {
      msg.className = 'bad';
      msg.textContent = words[op] + ' failed: ' + e.message;
    });
  }

  // errorText is an error answer's message: {"error": ...} or the
  // entries API's {"errors": [{pointer, message}]}.
  function errorText(res) {
    var b = res.body || {};
    if (b.error) { return b.error; }
    if (b.errors && b.errors.length) {
      return b.errors.map(function (e) { return (e.pointer ? e.pointer + ': ' : '') + e.message; }).join('; ');
    }
    return 'HTTP ' + res.status;
  }

  // A datetime-local input's value, read as UTC.
  function utc(v) {
    if (!v) { return ''; }
    return (v.length === 16 ? v + ':00' : v) + 'Z';
  }

  function backfill(form, dry) {
    var msg = document.getElementById('backfill-msg');
    var why = reason();
    if (why) {
      msg.className = 'bad';
      msg.textContent = 'Refused, not sent. ' + why;
      return;
    }
    var noteEl = document.getElementById('action-note');
    var spec = {
      from: utc(form.elements.from.value),
      to: utc(form.elements.to.value),
      dry_run: dry,
      include_fired: form.elements.include_fired.checked,
      note: noteEl ? noteEl.value : ''
    };
    if (form.elements.rate.value) { spec.rate = Number(form.elements.rate.value); }
    msg.className = '';
    msg.textContent = (dry ? 'Dry run' : 'Backfill') + ': sending…';
    fetch('/api/v1/entries/' + encodeURIComponent(form.dataset.entry) + '/backfill', {
      method: 'POST',
      headers: { 'Authorization': 'Bearer ' + token(), 'Content-Type': 'application/json', 'X-Beatd-Client': 'console' },
      body: JSON.stringify(spec),
      credentials: 'omit',
      cache: 'no-store'
    }).then(function (r) {
      return r.json().catch(function () { return {}; }).then(function (j) { return { status: r.status, body: j }; });
    }).then(function (res) {
      if (res.status === 200 || res.status === 202) {
        var a = res.body;
        msg.className = 'ok';
        msg.textContent = '';
        var p = document.createElement('p');
        p.textContent = dry ?
          'Dry run: ' + a.slots.length + ' slots, ' + a.publish + ' would be published, ' + a.fired + ' already fired.' :
          'Backfill ' + a.backfill.id + ' queued: ' + a.publish + ' slots to publish, ' + a.fired + ' already fired. Reload to follow it.';
        msg.appendChild(p);
        if (dry && a.slots.length) {
          var ul = document.createElement('ul');
          a.slots.slice(0, 50).forEach(function (s) {
            var li = document.createElement('li');
            li.textContent = s.slot + (s.fired ? ' (already fired)' : '') + ' ' + s.task_id;
            ul.appendChild(li);
          });
          msg.appendChild(ul);
          if (a.slots.length > 50) {
            var more = document.createElement('p');
            more.textContent = '… and ' + (a.slots.length - 50) + ' more.';
            msg.appendChild(more);
          }
        }
        return;
      }
      msg.className = 'bad';
      msg.textContent = (dry ? 'Dry run' : 'Backfill') + ' refused (' + res.status + '): ' + errorText(res) + '.';
    }).catch(function (e) {
      msg.className = 'bad';
      msg.textContent = 'Backfill failed: ' + e.message;
    });
  }

  function rel(ms) {
    var d = ms - Date.now(), future = d >= 0, s;
    d = Math.abs(d);
    if (d < 1000) { return 'now'; }
    if (d < 60000) { s = Math.floor(d / 1000) + ' s'; }
    else if (d < 3600000) { s = Math.floor(d / 60000) + ' min'; }
    else if (d < 172800000) { s = Math.floor(d / 3600000) + ' h ' + Math.floor(d % 3600000 / 60000) + ' min'; }
    else { s = Math.floor(d / 86400000) + ' d'; }
    return future ? 'in ' + s : s + ' ago';
  }
  function tick() {
    var ts = document.querySelectorAll('time.rel[data-at]');
    for (var i = 0; i < ts.length; i++) {
      var at = Number(ts[i].dataset.at);
      if (at > 0) { ts[i].textContent = rel(at); }
    }
  }

  // Live updates: each event carries the HTML of the sections that
  // changed, rendered (and escaped) by the server's templates.
  function live() {
    var url = body.dataset.events, state = document.getElementById('live-state');
    if (!state) { return; }
    if (!url || !window.EventSource) { state.textContent = 'Live updates unavailable: reload to refresh.'; return; }
    var es = new EventSource(url);
    es.onopen = function () { state.textContent = 'Live'; state.className = 'live ok'; };
    es.onerror = function () {
      // A refused stream (401: signed out, or the token was revoked) is
      // not retried by the browser; a dropped one is.
      if (es.readyState === EventSource.CLOSED) {
        state.textContent = 'Live updates stopped: reload the page (you may need to sign in again).';
      } else {
        state.textContent = 'Live updates: reconnecting…';
      }
      state.className = 'live bad';
    };
    es.addEventListener('sections', function (ev) {
      var data = JSON.parse(ev.data);
      var focused = document.activeElement && document.activeElement.id;
      Object.keys(data.sections).forEach(function (id) {
        var el = document.getElementById(id);
        if (el) { el.innerHTML = data.sections[id]; }
      });
      if (focused && document.activeElement === body) {
        var f = document.getElementById(focused);
        if (f) { f.focus(); }
      }
      tick();
      applyAuth();
      body.dataset.updated = String(Date.now());
    });
  }

  document.addEventListener('DOMContentLoaded', function () {
    // The sign-in form posts the token to the server, which keeps it in
    // an HttpOnly cookie for reading; this tab keeps it too, for actions.
    var login = document.getElementById('login-form');
    if (login) {
      login.addEventListener('submit', function () {
        setToken(document.getElementById('login-token').value.trim());
      });
      return;
    }
    var logout = document.getElementById('logout-form');
    if (logout) {
      logout.addEventListener('submit', function () { setToken(''); });
    }
    var form = document.getElementById('token-form');
    form.addEventListener('submit', function (e) {
      e.preventDefault();
      var input = document.getElementById('token');
      setToken(input.value.trim());
      input.value = '';
    });
    document.getElementById('token-forget').addEventListener('click', function () { setToken(''); });
    document.addEventListener('click', function (e) {
      var b = e.target.closest && e.target.closest('button[data-op]');
      if (b) { act(b); }
    });
    var bf = document.getElementById('backfill-form');
    if (bf) {
      bf.addEventListener('submit', function (e) {
        e.preventDefault();
        var by = e.submitter || document.activeElement;
        backfill(bf, !(by && by.dataset.bf === 'run'));
      });
    }
    applyAuth();
    tick();
    setInterval(tick, 1000);
  });
  // The stream opens after the load event, so it never holds the page's
  // load open.
  window.addEventListener('load', function () { setTimeout(live, 0); });
})();
