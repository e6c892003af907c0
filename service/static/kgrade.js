// kgrade pages: a little JavaScript on top of pages that work without it. No inline scripts
// (the Content-Security-Policy forbids them): data comes in data-* attributes or
// <script type="application/json"> blocks.
(function () {
  "use strict";

  function ready(fn) {
    if (document.readyState !== "loading") fn();
    else document.addEventListener("DOMContentLoaded", fn);
  }

  // --- forms that post themselves (deep-linking return) ------------------------------------
  function autosubmit() {
    document.querySelectorAll("form[data-autosubmit]").forEach(function (form) {
      form.submit();
    });
  }

  // --- quiz: answer without leaving the page ------------------------------------------------
  function answerForms(root) {
    (root || document).querySelectorAll("form.answer-form").forEach(function (form) {
      form.addEventListener("submit", function (event) {
        if (!window.fetch || !window.FormData) return;
        event.preventDefault();
        var button = form.querySelector("button[type=submit]");
        if (button) button.disabled = true;
        fetch(form.action, {
          method: "POST",
          body: new FormData(form),
          headers: { "X-Kgrade-Partial": "1", Accept: "text/html" },
          credentials: "same-origin",
        })
          .then(function (resp) {
            return resp.text().then(function (html) {
              return { ok: resp.ok || resp.status === 422, html: html };
            });
          })
          .then(function (r) {
            if (!r.ok) {
              form.submit();
              return;
            }
            var section = form.closest("section.item");
            var holder = document.createElement("div");
            holder.innerHTML = r.html;
            var fresh = holder.querySelector("section.item");
            if (!section || !fresh) {
              form.submit();
              return;
            }
            section.replaceWith(fresh);
            answerForms(fresh.parentNode);
            updateProgress(fresh);
            var focus = fresh.querySelector(".feedback h3, .field .error, legend");
            if (focus) {
              focus.setAttribute("tabindex", "-1");
              focus.focus();
            }
          })
          .catch(function () {
            form.submit();
          });
      });
    });
  }

  function updateProgress(holder) {
    var info = holder.querySelector("[data-answered]");
    if (!info) return;
    var answered = info.getAttribute("data-answered");
    var total = info.getAttribute("data-total");
    document.querySelectorAll("progress.quiz-progress").forEach(function (p) {
      p.value = Number(answered);
    });
    document.querySelectorAll(".answered-count").forEach(function (el) {
      el.textContent = answered + " of " + total;
    });
    var itemId = info.getAttribute("data-item");
    document.querySelectorAll('.item-nav a[data-item="' + itemId + '"]').forEach(function (a) {
      a.classList.add("answered");
    });
  }

  // --- exercise: code editor and file upload -----------------------------------------------
  function editor() {
    var area = document.getElementById("source");
    if (!area || !window.KgradeEditor) return;
    var view = window.KgradeEditor.attach(area);
    var file = document.getElementById("file");
    if (file && window.FileReader) {
      file.addEventListener("change", function () {
        if (!file.files || !file.files[0]) return;
        var reader = new FileReader();
        reader.onload = function () {
          window.KgradeEditor.setValue(view, String(reader.result));
          // The editor now holds the file: send that, so what is seen is what is graded.
          file.value = "";
          var note = document.getElementById("file-loaded");
          if (note) note.textContent = "Loaded into the editor above.";
        };
        reader.readAsText(file.files[0]);
      });
    }
  }

  // --- grading progress, polled ---------------------------------------------------------------
  function progress() {
    var box = document.getElementById("grading-status");
    if (!box || box.getAttribute("data-finished") === "true") return;
    var url = box.getAttribute("data-status-url");
    var phase = box.querySelector(".phase");
    var bar = box.querySelector("progress");
    var count = box.querySelector(".count");
    var queue = box.querySelector(".queue");
    function tick() {
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (resp) {
          return resp.json();
        })
        .then(function (s) {
          if (s.finished) {
            window.location.reload();
            return;
          }
          phase.textContent = s.phase_text;
          if (s.total) {
            bar.max = s.total;
            bar.value = s.done || 0;
            count.textContent = (s.done || 0) + " of " + s.total;
          } else {
            bar.removeAttribute("value");
            count.textContent = "";
          }
          queue.textContent = s.queue_position ? "Position in the queue: " + s.queue_position : "";
          window.setTimeout(tick, 1000);
        })
        .catch(function () {
          window.setTimeout(tick, 3000);
        });
    }
    window.setTimeout(tick, 500);
  }

  // --- timings chart -----------------------------------------------------------------------------
  function chart() {
    var canvas = document.getElementById("timings-chart");
    var data = document.getElementById("timings-data");
    if (!canvas || !data || !window.Chart) return;
    var d = JSON.parse(data.textContent);
    new window.Chart(canvas, {
      type: "bar",
      data: {
        labels: d.labels,
        datasets: [
          { label: "Your kernel (median ms)", data: d.submission, backgroundColor: "#1a5fb4" },
          { label: "Reference (median ms)", data: d.reference, backgroundColor: "#b35900" },
        ],
      },
      options: {
        responsive: true,
        maintainAspectRatio: false,
        scales: { y: { beginAtZero: true, title: { display: true, text: "milliseconds" } } },
      },
    });
  }

  // --- math --------------------------------------------------------------------------------------
  function math() {
    if (!window.katex) return;
    document.querySelectorAll(".math").forEach(function (el) {
      try {
        window.katex.render(el.textContent, el, {
          displayMode: el.classList.contains("block"),
          throwOnError: false,
        });
      } catch (e) {
        /* leave the TeX source visible */
      }
    });
  }

  // --- LTI platform storage (postMessage), when the browser refuses our cookies ------------
  function platformTarget(name) {
    if (!window.parent || window.parent === window) return null;
    if (name === "_parent") return window.parent;
    try {
      return window.parent.frames[name] || null;
    } catch (e) {
      return null;
    }
  }

  function storageCall(target, origin, message, timeoutMs) {
    return new Promise(function (resolve, reject) {
      var id = "kg-" + Math.random().toString(36).slice(2);
      var timer = window.setTimeout(function () {
        window.removeEventListener("message", onMessage);
        reject(new Error("timeout"));
      }, timeoutMs);
      function onMessage(event) {
        var d = event.data;
        if (!d || d.message_id !== id) return;
        if (origin !== "*" && event.origin !== origin) return;
        window.clearTimeout(timer);
        window.removeEventListener("message", onMessage);
        if (d.error) reject(new Error(d.error.message || d.error.code || "error"));
        else resolve(d);
      }
      window.addEventListener("message", onMessage);
      message.message_id = id;
      target.postMessage(message, origin);
    });
  }

  function storageLogin() {
    var el = document.getElementById("lti-storage-login");
    if (!el) return;
    var go = function () {
      window.location.href = el.getAttribute("data-auth-url");
    };
    var target = platformTarget(el.getAttribute("data-target"));
    if (!target) return go();
    var origin = el.getAttribute("data-origin");
    var state = el.getAttribute("data-state");
    var nonce = el.getAttribute("data-nonce");
    storageCall(target, origin, { subject: "lti.put_data", key: "kgrade_state_" + state, value: state }, 2000)
      .then(function () {
        return storageCall(target, origin, { subject: "lti.put_data", key: "kgrade_nonce_" + nonce, value: nonce }, 2000);
      })
      .then(go, go);
  }

  function jwtNonce(token) {
    try {
      var part = token.split(".")[1].replace(/-/g, "+").replace(/_/g, "/");
      while (part.length % 4) part += "=";
      return JSON.parse(window.atob(part)).nonce;
    } catch (e) {
      return null;
    }
  }

  function storageLaunch() {
    var form = document.getElementById("lti-storage-launch");
    if (!form) return;
    var fail = function () {
      document.getElementById("lti-storage-failed").hidden = false;
      document.getElementById("lti-storage-wait").hidden = true;
    };
    var target = platformTarget(form.getAttribute("data-target"));
    if (!target) return fail();
    var origin = form.getAttribute("data-origin");
    var state = form.querySelector("input[name=state]").value;
    var nonce = jwtNonce(form.querySelector("input[name=id_token]").value);
    storageCall(target, origin, { subject: "lti.get_data", key: "kgrade_state_" + state }, 2000)
      .then(function (r) {
        if (r.value !== state) throw new Error("state");
        return storageCall(target, origin, { subject: "lti.get_data", key: "kgrade_nonce_" + nonce }, 2000);
      })
      .then(function (r) {
        if (!nonce || r.value !== nonce) throw new Error("nonce");
        form.submit();
      })
      .catch(fail);
  }

  ready(function () {
    autosubmit();
    answerForms();
    editor();
    progress();
    chart();
    math();
    storageLogin();
    storageLaunch();
  });
})();
