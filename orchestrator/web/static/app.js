// fleet web: live fragments over server-sent events. No inline script runs on these pages
// (the Content-Security-Policy forbids it); the server renders every fragment with its
// template's autoescape, so a child's words arrive here as escaped text.
"use strict";

function follow(element) {
  const source = new EventSource(element.dataset.live);
  source.addEventListener(element.dataset.event, (message) => {
    // Keep what the person is typing: a fragment with a focused field waits for the next one.
    const active = document.activeElement;
    if (active && element.contains(active) && active.tagName === "INPUT" && active.value) {
      return;
    }
    element.innerHTML = message.data;
    document.body.dataset.updated = String(Date.now());
  });
  source.addEventListener("error", () => {
    document.body.classList.add("offline");
  });
  source.addEventListener("open", () => {
    document.body.classList.remove("offline");
  });
}

document.addEventListener("DOMContentLoaded", () => {
  for (const element of document.querySelectorAll("[data-live]")) {
    follow(element);
  }
  for (const form of document.querySelectorAll("form.act")) {
    form.addEventListener("submit", () => {
      for (const button of form.querySelectorAll("button")) {
        button.disabled = true;
      }
      form.classList.add("busy");
    });
  }
});
