// Gradient dashboard: the live build log. The page holds the log up to
// its last complete line; an EventSource streams the lines after it (the
// browser resumes with Last-Event-ID after a reconnect, so each line
// comes once, in order). Lines are inserted as text, never as HTML.
"use strict";
(function () {
  const log = document.getElementById("log");
  if (!log || !log.dataset.stream) {
    return;
  }
  const follow = () => window.innerHeight + window.scrollY >= document.body.scrollHeight - 40;
  const es = new EventSource(log.dataset.stream);
  es.onmessage = (ev) => {
    const atEnd = follow();
    log.appendChild(document.createTextNode(ev.data + "\n"));
    if (atEnd) {
      window.scrollTo(0, document.body.scrollHeight);
    }
  };
  es.addEventListener("end", (ev) => {
    es.close();
    const status = document.getElementById("build-status");
    if (status) {
      status.textContent = ev.data;
    }
    const live = document.getElementById("log-live");
    if (live) {
      // The log is whole now; outputs, duration and failure are on the
      // reloaded page.
      live.textContent = "The build ended: " + ev.data + ". ";
      const again = document.createElement("a");
      again.href = window.location.pathname;
      again.id = "reload";
      again.textContent = "Reload for its outputs";
      live.appendChild(again);
      live.dataset.ended = "true";
    }
  });
})();
