// The Disbatch queue browser: the same calls as Disbatch 4.103's page
// (GET /plugins, /queues, /nodes; POST /queues, /queues/:id, /nodes/:node,
// all JSON), written for this server.
"use strict";

function call(method, url, body) {
  var opts = { method: method, headers: {} };
  if (body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  return fetch(url, opts).then(function (r) {
    return r.text().then(function (text) {
      var data = text ? JSON.parse(text) : null;
      if (!r.ok) { throw new Error(method + " " + url + ": " + r.status + " " + text); }
      return data;
    });
  });
}

function showError(e) { document.getElementById("error").textContent = e ? String(e.message || e) : ""; }

function cell(tr, text, cls) {
  var td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) { td.className = cls; }
  tr.appendChild(td);
  return td;
}

function numberEditor(td, value, save) {
  var input = document.createElement("input");
  input.className = "threads";
  input.value = value === null || value === undefined ? "" : value;
  input.addEventListener("change", function () {
    var v = input.value.trim();
    save(v === "" ? null : Number(v)).then(function () { showError(); refresh(); }, showError);
  });
  td.textContent = "";
  td.appendChild(input);
}

function loadQueues() {
  return call("GET", "/queues").then(function (queues) {
    var tbody = document.querySelector("#queues tbody");
    tbody.textContent = "";
    queues.forEach(function (q) {
      var tr = document.createElement("tr");
      cell(tr, q.id);
      cell(tr, q.plugin);
      cell(tr, q.name);
      numberEditor(cell(tr, ""), q.threads, function (v) { return call("POST", "/queues/" + q.id, { threads: v }); });
      cell(tr, q.queued, "n");
      cell(tr, q.running, "n");
      cell(tr, q.completed, "n");
      var del = document.createElement("button");
      del.textContent = "Delete";
      del.addEventListener("click", function () {
        if (confirm("Delete queue " + q.name + "?")) { call("DELETE", "/queues/" + q.id).then(refresh, showError); }
      });
      cell(tr, "").appendChild(del);
      tbody.appendChild(tr);
    });
  });
}

function loadNodes() {
  return call("GET", "/nodes").then(function (nodes) {
    var tbody = document.querySelector("#nodes tbody");
    tbody.textContent = "";
    var cutoff = Date.now() - 15 * 60 * 1000; // nodes silent for 15 minutes are hidden, as in 4.103
    nodes.filter(function (n) { return n.timestamp >= cutoff; }).forEach(function (n) {
      var tr = document.createElement("tr");
      cell(tr, n.node);
      cell(tr, new Date(n.timestamp).toISOString());
      numberEditor(cell(tr, ""), n.maxthreads, function (v) { return call("POST", "/nodes/" + encodeURIComponent(n.node), { maxthreads: v }); });
      cell(tr, n.drain ? "draining" : "");
      tbody.appendChild(tr);
    });
  });
}

function loadPlugins() {
  return call("GET", "/plugins").then(function (plugins) {
    var select = document.querySelector("#create select");
    select.textContent = "";
    plugins.forEach(function (p) {
      var o = document.createElement("option");
      o.value = o.textContent = p;
      select.appendChild(o);
    });
  });
}

function refresh() { return Promise.all([loadQueues(), loadNodes()]).catch(showError); }

document.getElementById("create").addEventListener("submit", function (ev) {
  ev.preventDefault();
  var f = ev.target;
  call("POST", "/queues", { name: f.name.value, plugin: f.plugin.value }).then(function () { f.name.value = ""; showError(); refresh(); }, showError);
});

loadPlugins().catch(showError);
refresh();
setInterval(loadNodes, 60000);
