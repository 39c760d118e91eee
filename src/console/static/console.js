// qlsched console: optional comforts only (the pages work without this file).
// - auto-refresh: a checkbox in the footer reloads the page every 10 s (remembered per tab);
// - sorting: a click on a header of a table.sortable sorts the rows shown (this page only).
"use strict";
(function () {
  var KEY = "qlsched-refresh";
  var slot = document.getElementById("refresh-slot");
  if (slot) {
    var label = document.createElement("label");
    var box = document.createElement("input");
    box.type = "checkbox";
    box.id = "auto-refresh";
    box.checked = sessionStorage.getItem(KEY) === "1";
    label.appendChild(box);
    label.appendChild(document.createTextNode(" Auto-refresh (10 s)"));
    slot.appendChild(label);
    var timer = null;
    var arm = function () {
      if (timer) { clearTimeout(timer); timer = null; }
      if (box.checked) { timer = setTimeout(function () { location.reload(); }, 10000); }
    };
    box.addEventListener("change", function () {
      sessionStorage.setItem(KEY, box.checked ? "1" : "0");
      arm();
    });
    arm();
  }
  var text = function (row, i) {
    var c = row.children[i];
    return c ? c.textContent.trim() : "";
  };
  var num = function (s) {
    var m = /^(-?[0-9.]+)\s*(ms|s|min|h)?/.exec(s);
    if (!m) { return NaN; }
    var f = { ms: 1, s: 1000, min: 60000, h: 3600000 }[m[2] || "ms"];
    return parseFloat(m[1]) * f;
  };
  document.querySelectorAll("table.sortable").forEach(function (table) {
    var heads = table.querySelectorAll("thead th");
    heads.forEach(function (th, i) {
      th.setAttribute("aria-sort", "none");
      th.addEventListener("click", function () {
        var asc = th.getAttribute("aria-sort") !== "ascending";
        heads.forEach(function (h) { h.setAttribute("aria-sort", "none"); });
        th.setAttribute("aria-sort", asc ? "ascending" : "descending");
        var body = table.tBodies[0];
        var rows = Array.prototype.slice.call(body.rows);
        rows.sort(function (a, b) {
          var x = text(a, i), y = text(b, i);
          var nx = num(x), ny = num(y);
          var r = (!isNaN(nx) && !isNaN(ny)) ? nx - ny : x.localeCompare(y);
          return asc ? r : -r;
        });
        rows.forEach(function (r) { body.appendChild(r); });
      });
    });
  });
  document.documentElement.setAttribute("data-js", "ready");
})();
