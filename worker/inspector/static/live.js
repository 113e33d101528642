// memworker inspector: the change feed as it happens (server-sent events). Written here, no
// dependency. Every value is shown with textContent: nothing an event holds becomes markup.
(function () {
  "use strict";
  var list = document.getElementById("changes");
  var state = document.getElementById("feed-state");
  if (!list || !window.EventSource) { return; }
  var source = new EventSource(list.getAttribute("data-source"));
  source.addEventListener("open", function () { state.textContent = "Live: new changes appear below."; });
  source.addEventListener("error", function () { state.textContent = "Disconnected: retrying…"; });
  source.addEventListener("change", function (message) {
    var event;
    try { event = JSON.parse(message.data); } catch (e) { return; }
    var item = document.createElement("li");
    var parts = [event.occurred_at || "", event.type || "", event.user_id ? "user " + event.user_id : ""];
    ["session_id", "episode_id", "fact_id", "name", "id"].forEach(function (k) {
      if (event[k]) { parts.push(k + " " + event[k]); }
    });
    if (event.counts) { parts.push(JSON.stringify(event.counts)); }
    item.textContent = parts.filter(Boolean).join(" · ");
    item.setAttribute("data-type", event.type || "");
    list.insertBefore(item, list.firstChild);
    while (list.children.length > 200) { list.removeChild(list.lastChild); }
  });
})();
