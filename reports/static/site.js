// Sortable and filterable tables, shared by every page. Data cells may carry data-v (a raw
// value to sort by); filters are <input data-filter="TABLE_ID"> (text in any cell) and
// <select data-filter="TABLE_ID" data-col="N"> (exact text of column N).
(function () {
  "use strict";
  function key(cell) {
    var v = cell.getAttribute("data-v");
    if (v === null) { v = cell.textContent.trim().toLowerCase(); }
    var n = Number(v);
    return v !== "" && !isNaN(n) ? n : v;
  }
  function sortBy(table, col, th) {
    var body = table.tBodies[0];
    var desc = th.getAttribute("aria-sort") === "ascending";
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", desc ? "descending" : "ascending");
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = key(a.cells[col]), y = key(b.cells[col]);
      if (typeof x !== typeof y) { x = String(x); y = String(y); }
      var r = x < y ? -1 : x > y ? 1 : 0;
      return desc ? -r : r;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  }
  Array.prototype.forEach.call(document.querySelectorAll("table.sortable"), function (table) {
    Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
      th.addEventListener("click", function () { sortBy(table, col, th); });
    });
  });
  function applyFilters(tableId) {
    var table = document.getElementById(tableId);
    if (!table) { return; }
    var controls = document.querySelectorAll('[data-filter="' + tableId + '"]');
    var shown = 0;
    Array.prototype.forEach.call(table.tBodies[0].rows, function (row) {
      var ok = true;
      Array.prototype.forEach.call(controls, function (c) {
        var want = c.value.trim().toLowerCase();
        if (!want || !ok) { return; }
        if (c.hasAttribute("data-col")) {
          var cell = row.cells[Number(c.getAttribute("data-col"))];
          ok = cell.textContent.trim().toLowerCase() === want;
        } else {
          ok = row.textContent.toLowerCase().indexOf(want) !== -1;
        }
      });
      row.classList.toggle("hidden", !ok);
      if (ok) { shown += 1; }
    });
    var count = document.querySelector('[data-count="' + tableId + '"]');
    if (count) { count.textContent = shown + " shown"; }
  }
  Array.prototype.forEach.call(document.querySelectorAll("[data-filter]"), function (c) {
    var id = c.getAttribute("data-filter");
    c.addEventListener("input", function () { applyFilters(id); });
    c.addEventListener("change", function () { applyFilters(id); });
  });
})();
