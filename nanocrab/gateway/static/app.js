// The web view's live parts: sign-in, task submission, approve/deny, a run's live timeline.
// Plain browser JavaScript against the JSON API (docs/gateway.md); the session cookie is the token.
"use strict";

async function api(method, path, body) {
  const response = await fetch(path, {
    method,
    headers: body === undefined ? {} : { "Content-Type": "application/json" },
    body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "same-origin",
  });
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(data.detail || data.title || response.statusText);
  return data;
}

function cell(row, text) {
  const td = document.createElement("td");
  td.textContent = text;
  row.appendChild(td);
}

function approvalButtons(container) {
  container.addEventListener("click", async (click) => {
    const button = click.target.closest("button.approve, button.deny");
    if (!button) return;
    const id = button.dataset.approval;
    const verb = button.classList.contains("approve") ? "approve" : "deny";
    const body = verb === "deny" ? { reason: prompt("Why deny?") || "" } : {};
    if (button.dataset.run) body.run_id = button.dataset.run;
    button.disabled = true;
    try {
      await api("POST", `/v1/approvals/${encodeURIComponent(id)}/${verb}`, body);
      const box = button.closest(".approval, tr[data-approval]");
      box.classList.add("answered");
      box.textContent = `${verb === "approve" ? "approved" : "denied"} ${id}`;
    } catch (error) {
      button.disabled = false;
      alert(`${verb} failed: ${error.message}`);
    }
  });
}

function liveTimeline(table) {
  const run = table.dataset.run;
  const body = table.querySelector("tbody");
  const status = document.getElementById("run-status");
  const approvals = document.getElementById("approvals");
  const deltas = document.getElementById("deltas");
  const canApprove = approvals.dataset.canApprove === "yes";
  const source = new EventSource(
    `/v1/runs/${encodeURIComponent(run)}/events?after=${table.dataset.position}`
  );
  const show = (message) => {
    const event = JSON.parse(message.data);
    if (event.type === "llm.delta") {
      deltas.textContent += event.data.text;
      return;
    }
    const row = document.createElement("tr");
    row.dataset.seq = event.seq;
    row.dataset.type = event.type;
    cell(row, event.seq);
    cell(row, (event.time || "").slice(11, 23));
    cell(row, event.type);
    cell(row, event.source || "");
    cell(row, summary(event));
    cell(row, "");
    body.appendChild(row);
    if (event.type === "run.started") status.textContent = "running";
    if (event.type === "approval.requested") {
      status.textContent = "awaiting_approval";
      const box = document.createElement("div");
      box.className = "approval";
      box.dataset.approval = event.data.approval_id;
      box.textContent = `waiting: ${event.data.tool} needs approval (${event.data.tier}): ${event.data.reason} `;
      const args = document.createElement("pre");  // the whole call, as approving would run it
      args.className = "arguments";
      args.textContent = JSON.stringify(event.data.arguments, null, 1);
      box.appendChild(args);
      if (canApprove) {
        for (const verb of ["approve", "deny"]) {
          const button = document.createElement("button");
          button.className = verb;
          button.dataset.approval = event.data.approval_id;
          button.dataset.run = run;
          button.textContent = verb === "approve" ? "Approve" : "Deny";
          box.appendChild(button);
        }
      }
      approvals.appendChild(box);
    }
    if (event.type === "approval.granted" || event.type === "approval.denied") {
      status.textContent = "running";
    }
    if (event.type === "llm.requested") deltas.textContent = "";
    if (event.type === "llm.responded") bump("turns");
    if (event.type === "tool.completed") bump("tool-calls");
    if (event.type === "run.completed") document.getElementById("reply").textContent = event.data.reply;
    if (["run.completed", "run.failed", "run.cancelled"].includes(event.type)) {
      status.textContent = event.type.slice(4);
      status.className = `status ${event.type.slice(4)}`;
      source.close();
    }
  };
  source.onmessage = show;
  for (const type of ["task.submitted", "run.started", "route.decided", "llm.requested", "llm.delta",
    "llm.responded", "llm.failed", "tool.requested", "tool.started", "tool.completed", "tool.skipped",
    "grant.issued", "grant.denied", "grant.revoked", "approval.requested", "approval.granted",
    "approval.denied", "approval.expired", "guardrail.checked", "message.queued", "reply.sent",
    "run.completed", "run.failed", "run.cancelled", "subagent.spawned", "subagent.completed",
    "context.compacted", "memory.recalled", "security.rejected", "bus.rejected"]) {
    source.addEventListener(type, show);
  }
}

function branchButtons(table) {
  // "Branch" on a timeline row: a new session from that event, then a task box to continue it
  table.addEventListener("click", async (click) => {
    const button = click.target.closest("button.branch");
    if (!button) return;
    const run = table.dataset.run;
    button.disabled = true;
    try {
      const done = await api("POST", `/v1/runs/${encodeURIComponent(run)}/branch`,
        { at: button.dataset.event });
      location.href = `/?session=${encodeURIComponent(done.session_id)}&from=${encodeURIComponent(run)}`;
    } catch (error) {
      button.disabled = false;
      alert(`branch failed: ${error.message}`);
    }
  });
}

function bump(id) {
  const counter = document.getElementById(id);
  if (counter) counter.textContent = String(Number(counter.textContent) + 1);
}

function summary(event) {
  const d = event.data || {};
  switch (event.type) {
    case "task.submitted": return d.text;
    case "tool.requested": return `${d.tool}(${JSON.stringify(d.arguments)})`;
    case "tool.completed": return `${d.tool} ${d.is_error ? "failed" : "ok"}`;
    case "approval.requested": return `${d.tool} needs approval (${d.tier})`;
    case "approval.granted": return `approved by ${d.approver}`;
    case "approval.denied": return `denied by ${d.approver}: ${d.reason}`;
    case "reply.sent": return d.text;
    case "run.completed": return d.reply;
    case "run.failed": return `${d.kind}: ${d.reason}`;
    default: return "";
  }
}

document.addEventListener("DOMContentLoaded", () => {
  const login = document.getElementById("login");
  if (login) {
    login.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      try {
        await api("POST", "/login", { token: document.getElementById("token").value });
        location.href = "/";
      } catch (error) {
        document.getElementById("login-error").textContent = error.message;
      }
    });
  }
  const task = document.getElementById("submit-task");
  if (task) {
    task.addEventListener("submit", async (submit) => {
      submit.preventDefault();
      try {
        const body = { text: document.getElementById("task-text").value };
        const session = document.getElementById("task-session");
        if (session && session.value) body.session_id = session.value;
        const done = await api("POST", "/v1/tasks", body);
        location.href = `/runs/${done.run_id}`;
      } catch (error) {
        document.getElementById("submit-result").textContent = error.message;
      }
    });
  }
  for (const box of document.querySelectorAll("#approvals, #approvals-table")) approvalButtons(box);
  const timeline = document.getElementById("timeline");
  if (timeline) branchButtons(timeline);
  if (timeline && timeline.dataset.done !== "yes") liveTimeline(timeline);
});
