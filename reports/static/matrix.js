// The compatibility matrix, built from #matrix-data: reasons on hover (pinned on click),
// sorting and filtering of targets and drafts. Cells carry only a class; every text is
// written with textContent, never parsed as HTML.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("matrix-data").textContent);
  var table = document.getElementById("matrix");
  var body = table.tBodies[0];
  var head = table.tHead.rows[0];
  var panel = document.getElementById("reason");
  var nT = data.t.length, nD = data.d.length;
  data.d.forEach(function (m) {
    var th = document.createElement("th");
    th.textContent = m[1];
    th.title = m[1];
    head.appendChild(th);
  });
  var frag = document.createDocumentFragment();
  data.t.forEach(function (m, i) {
    var tr = document.createElement("tr");
    tr.setAttribute("data-i", String(i));
    var th = document.createElement("th");
    var a = document.createElement("a");
    a.href = m[3];
    a.textContent = m[1];
    a.title = m[1];
    th.appendChild(a);
    tr.appendChild(th);
    var codes = data.c[i];
    for (var j = 0; j < nD; j++) {
      var td = document.createElement("td");
      var c = codes.charAt(j);
      if (c !== "0") { td.className = "v" + c; }
      tr.appendChild(td);
    }
    frag.appendChild(tr);
  });
  body.appendChild(frag);
  var rows = Array.prototype.slice.call(body.rows);
  var cells = rows.map(function (r) { return Array.prototype.slice.call(r.cells, 1); });
  var heads = Array.prototype.slice.call(head.cells, 1);
  var colOrder = data.d.map(function (_, j) { return j; });
  var usableRow = new Array(nT).fill(0), usableCol = new Array(nD).fill(0);
  data.c.forEach(function (codes, i) {
    for (var j = 0; j < nD; j++) {
      var c = codes.charAt(j);
      if (c === "1" || c === "2") { usableRow[i] += 1; usableCol[j] += 1; }
    }
  });
  var pinned = null;

  function show(i, j) {
    var code = data.c[i].charAt(j);
    var ri = data.x[i][j];
    panel.textContent = "";
    var head = document.createElement("div");
    var t = document.createElement("a");
    t.href = data.t[i][3];
    t.textContent = data.t[i][1];
    head.appendChild(t);
    head.appendChild(document.createTextNode("  ×  " + data.d[j][1] + ":  "));
    var v = document.createElement("span");
    v.className = "v";
    v.textContent = data.labels[code];
    head.appendChild(v);
    panel.appendChild(head);
    var why = document.createElement("div");
    why.className = "why";
    why.textContent = ri >= 0 ? data.r[ri] : (code === "1" ? "all checks pass" : "");
    panel.appendChild(why);
  }
  function locate(td) {
    if (!td || td.tagName !== "TD") { return null; }
    return [Number(td.parentNode.getAttribute("data-i")), colOrder[td.cellIndex - 1]];
  }
  body.addEventListener("mouseover", function (e) {
    if (pinned) { return; }
    var at = locate(e.target);
    if (at) { show(at[0], at[1]); }
  });
  body.addEventListener("click", function (e) {
    var at = locate(e.target);
    if (!at) { return; }
    if (pinned) { pinned.classList.remove("sel"); }
    if (pinned === e.target) { pinned = null; return; }
    pinned = e.target;
    pinned.classList.add("sel");
    show(at[0], at[1]);
  });

  function comparator(list, usable, how) {
    return function (a, b) {
      if (how === "name") { return list[a][1].localeCompare(list[b][1]) || a - b; }
      if (how === "usable") { return usable[b] - usable[a] || a - b; }
      return a - b;  // the generated order: by size
    };
  }
  function sortRows(how) {
    var order = rows.map(function (_, i) { return i; });
    order.sort(comparator(data.t, usableRow, how));
    order.forEach(function (i) { body.appendChild(rows[i]); });
  }
  function sortCols(how) {
    colOrder = data.d.map(function (_, j) { return j; });
    colOrder.sort(comparator(data.d, usableCol, how));
    colOrder.forEach(function (j) { head.appendChild(heads[j]); });
    rows.forEach(function (row, i) {
      colOrder.forEach(function (j) { row.appendChild(cells[i][j]); });
    });
  }
  var colHidden = new Array(nD).fill(false);
  function filter() {
    var tq = document.getElementById("t-filter").value.trim().toLowerCase();
    var dq = document.getElementById("d-filter").value.trim().toLowerCase();
    var fam = document.getElementById("family").value;
    var only = document.getElementById("usable-only").checked;
    var shownT = 0, shownD = 0;
    rows.forEach(function (row, i) {
      var m = data.t[i];
      var ok = (!tq || m[1].toLowerCase().indexOf(tq) !== -1) &&
        (!fam || String(m[4]) === fam) && (!only || usableRow[i] > 0);
      row.classList.toggle("hidden", !ok);
      if (ok) { shownT += 1; }
    });
    for (var j = 0; j < nD; j++) {
      var m = data.d[j];
      var hide = !((!dq || m[1].toLowerCase().indexOf(dq) !== -1) &&
        (!fam || String(m[4]) === fam) && (!only || usableCol[j] > 0));
      if (!hide) { shownD += 1; }
      if (hide === colHidden[j]) { continue; }
      colHidden[j] = hide;
      heads[j].classList.toggle("hidden", hide);
      for (var i = 0; i < nT; i++) { cells[i][j].classList.toggle("hidden", hide); }
    }
    document.getElementById("m-count").textContent =
      shownT + " targets × " + shownD + " drafts shown";
  }
  document.getElementById("row-sort").addEventListener("change", function (e) { sortRows(e.target.value); });
  document.getElementById("col-sort").addEventListener("change", function (e) { sortCols(e.target.value); });
  var pending = null;
  ["t-filter", "d-filter"].forEach(function (id) {
    // Typing re-lays out up to 40,000 cells: wait for a pause in the typing.
    document.getElementById(id).addEventListener("input", function () {
      clearTimeout(pending);
      pending = setTimeout(filter, 120);
    });
  });
  ["family", "usable-only"].forEach(function (id) {
    document.getElementById(id).addEventListener("change", filter);
  });
  filter();
})();
