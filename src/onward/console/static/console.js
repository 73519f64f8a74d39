// Live refresh, the console's only script: every few seconds fetch this same page and swap
// in its <main>. Pages read the same without it (a <noscript> meta refresh stands in).
(function () {
  "use strict";
  var main = document.querySelector("main[data-live]");
  if (!main || !window.fetch || !window.DOMParser) return;
  function schedule(seconds) { window.setTimeout(tick, seconds * 1000); }
  function tick() {
    if (document.hidden) return schedule(Number(main.getAttribute("data-live")) || 5);
    fetch(window.location.href, { credentials: "same-origin", cache: "no-store" })
      .then(function (r) { return r.ok ? r.text() : Promise.reject(r.status); })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").querySelector("main");
        if (!fresh) return;
        var focused = document.activeElement && document.activeElement.id;
        main.innerHTML = fresh.innerHTML;
        if (focused && document.getElementById(focused)) document.getElementById(focused).focus();
        var next = fresh.getAttribute("data-live");
        if (next) { main.setAttribute("data-live", next); schedule(Number(next)); }
        else { main.removeAttribute("data-live"); }  // finished: nothing more to watch
      })
      .catch(function () { schedule(Number(main.getAttribute("data-live")) || 5); });
  }
  schedule(Number(main.getAttribute("data-live")) || 5);
})();
