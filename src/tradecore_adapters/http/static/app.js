// tradecore dashboard: the only script besides htmx. No inline code anywhere (the CSP forbids it).
// 1. Every htmx request that changes state carries the session's CSRF token (X-CSRF-Token),
//    read from <meta name="csrf-token">, which the server renders from the session that
//    issued it at login.
// 2. Copy buttons: <button data-copy="element-id"> copies that element's text.
// 3. <input data-from-fragment="name"> takes the value of "name" from the URL's fragment
//    (the password-reset link's #token=...; a fragment reaches no server), which is then
//    dropped from the address bar and the history.
// 4. Silent refresh: an htmx answer marked "Tradecore-Session: expired" (the access token
//    ran out while the page was open) is not swapped in; the session is renewed with
//    POST /auth/silent-refresh (the refresh cookie is sent to /auth only) and the request is
//    sent once more, unchanged and without asking its confirmation again. When the renewal
//    fails, or the repeated request is refused too, the login page opens and brings the user
//    back to this page.
"use strict";

(function () {
  const SAFE_METHODS = ["GET", "HEAD", "OPTIONS"];

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

  const SESSION_HEADER = "Tradecore-Session";
  const LOGIN_PATH = "/ui/login";
  // element -> htmx's function that sends its latest request again (htmx:confirm gives it)
  const sendAgain = new WeakMap();
  let renewal = null;
  let leaving = false;

  function setCsrfToken(token) {
    const meta = document.querySelector('meta[name="csrf-token"]');
    if (meta && token) {
      meta.setAttribute("content", token);
    }
  }

  // One renewal at a time: answers that expire together wait for the same one (the refresh
  // token rotates, so a second concurrent renewal would present a retired token).
  function renewSession() {
    if (renewal === null) {
      renewal = window.fetch("/auth/silent-refresh", {
        method: "POST",
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrfToken(), "Accept": "application/json" },
      })
        .then(function (response) { return response.ok ? response.json() : null; })
        .then(function (body) {
          if (body === null) {
            return false;
          }
          setCsrfToken(body.csrf_token);
          return true;
        })
        .catch(function () { return false; })
        .finally(function () { renewal = null; });
    }
    return renewal;
  }

  function toLogin() {
    leaving = true;
    const here = window.location.pathname + window.location.search;
    window.location.assign(LOGIN_PATH + "?next=" + encodeURIComponent(here));
  }

  document.addEventListener("htmx:confirm", function (event) {
    sendAgain.set(event.detail.elt, event.detail.issueRequest);
  });

  document.addEventListener("htmx:beforeSwap", function (event) {
    const xhr = event.detail.xhr;
    if (!xhr || xhr.getResponseHeader(SESSION_HEADER) !== "expired") {
      return;
    }
    event.detail.shouldSwap = false;
    if (leaving) {
      return; // already on the way to the login page
    }
    // The event fires on the request's target; the element that sent it is the config's.
    const sender = event.detail.requestConfig ? event.detail.requestConfig.elt : null;
    const again = sender ? sendAgain.get(sender) : undefined;
    // A repeated request fires no htmx:confirm, so it finds nothing here: no second retry.
    if (sender) {
      sendAgain.delete(sender);
    }
    if (!again) {
      toLogin();
      return;
    }
    renewSession().then(function (renewed) {
      if (renewed) {
        again(true);
      } else {
        toLogin();
      }
    });
  });

  document.addEventListener("htmx:configRequest", function (event) {
    const verb = String(event.detail.verb || "get").toUpperCase();
    const token = csrfToken();
    if (token && SAFE_METHODS.indexOf(verb) === -1) {
      event.detail.headers["X-CSRF-Token"] = token;
    }
  });

  function selectText(element) {
    const range = document.createRange();
    range.selectNodeContents(element);
    const selection = window.getSelection();
    selection.removeAllRanges();
    selection.addRange(range);
  }

  function copied(button, text) {
    const label = button.textContent;
    button.textContent = text;
    window.setTimeout(function () { button.textContent = label; }, 1500);
  }

  function fillFromFragment() {
    const inputs = document.querySelectorAll("input[data-from-fragment]");
    if (inputs.length === 0 || !window.location.hash) {
      return;
    }
    const values = new URLSearchParams(window.location.hash.slice(1));
    inputs.forEach(function (input) {
      input.value = values.get(input.getAttribute("data-from-fragment")) || "";
    });
    window.history.replaceState(null, "", window.location.pathname + window.location.search);
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", fillFromFragment);
  } else {
    fillFromFragment();
  }

  document.addEventListener("click", function (event) {
    const button = event.target.closest("button[data-copy]");
    if (!button) {
      return;
    }
    const source = document.getElementById(button.getAttribute("data-copy"));
    if (!source) {
      return;
    }
    const text = source.textContent.trim();
    if (navigator.clipboard && window.isSecureContext) {
      navigator.clipboard.writeText(text).then(
        function () { copied(button, "Copied"); },
        function () { selectText(source); copied(button, "Press Ctrl+C"); }
      );
    } else {
      selectText(source);
      copied(button, "Press Ctrl+C");
    }
  });
})();
