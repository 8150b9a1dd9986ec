// tradecore dashboard: the only script besides htmx. No inline code anywhere (the CSP forbids it).
// 1. Every htmx request that changes state carries the session's CSRF token (X-CSRF-Token),
//    read from <meta name="csrf-token">, which the server renders from the session that
//    issued it at login.
// 2. Copy buttons: <button data-copy="element-id"> copies that element's text.
// 3. <input data-from-fragment="name"> takes the value of "name" from the URL's fragment
//    (the password-reset link's #token=...; a fragment reaches no server), which is then
//    dropped from the address bar and the history.
"use strict";

(function () {
  const SAFE_METHODS = ["GET", "HEAD", "OPTIONS"];

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.getAttribute("content") : "";
  }

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
