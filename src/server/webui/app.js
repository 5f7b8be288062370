// The chat page: conversations (kept in the browser), the composer and its keys, streamed replies
// with their figures, regenerate, edit-and-continue, and the KV view beside it. Model text is
// untrusted: it reaches the DOM only through renderMarkdown (text nodes) or textContent.

import {streamChat, authHeaders} from './chat_client.js';
import {KvView} from './kvview.js';
import {renderMarkdown} from './markdown.js';
import {Store} from './store.js';

const $ = (id) => document.getElementById(id);
const store = new Store();
let active = null;  // the reply streaming now: {controller, conversationId}
let renderQueued = false;

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setStatus(text) {
  $('status').textContent = text;
}

function statsText(message) {
  const s = message.stats;
  if (!s) return message.pending ? 'waiting for the first token...' : '';
  const parts = [`${s.tokens} tokens`];
  if (s.tokens_per_s) parts.push(`${s.tokens_per_s.toFixed(1)} tok/s`);
  if (s.ttft_ms !== null && s.ttft_ms !== undefined) parts.push(`TTFT ${s.ttft_ms.toFixed(0)} ms`);
  if (s.cached_tokens !== null && s.cached_tokens !== undefined) {
    parts.push(`${s.cached_tokens} of ${s.prompt_tokens} prompt tokens cached`);
  }
  if (message.finish_reason) parts.push(message.finish_reason);
  return parts.join(' · ');
}

// ---- Sidebar: the conversations ----

function renderSidebar() {
  const list = $('conversations');
  list.replaceChildren(...store.conversations.map((c) => {
    const li = el('li', c.id === store.currentId ? 'current' : '');
    li.dataset.id = c.id;
    const open = el('button', 'title', c.title);
    open.type = 'button';
    open.addEventListener('click', () => selectConversation(c.id));
    const rename = el('button', 'icon', '✎');
    rename.type = 'button';
    rename.title = rename.ariaLabel = `Rename ${c.title}`;
    rename.addEventListener('click', () => startRename(li, c));
    const remove = el('button', 'icon', '×');
    remove.type = 'button';
    remove.title = remove.ariaLabel = `Delete ${c.title}`;
    remove.addEventListener('click', () => {
      if (active?.conversationId === c.id) stopReply();
      store.remove(c.id);
      renderAll();
    });
    li.append(open, rename, remove);
    return li;
  }));
}

function startRename(li, conversation) {
  const input = el('input', 'rename');
  input.value = conversation.title;
  input.ariaLabel = 'Conversation title';
  let finished = false;  // re-rendering removes the input, which blurs it: act once
  const done = (commit) => {
    if (finished) return;
    finished = true;
    if (commit) store.rename(conversation.id, input.value);
    renderAll();
  };
  input.addEventListener('keydown', (e) => {
    if (e.key === 'Enter') done(true);
    if (e.key === 'Escape') {
      e.stopPropagation();
      done(false);
    }
  });
  input.addEventListener('blur', () => done(true));
  li.replaceChildren(input);
  input.focus();
  input.select();
}

function selectConversation(id) {
  store.select(id);
  document.body.classList.remove('show-sidebar');
  renderAll();
  $('input').focus();
}

// ---- Messages ----

function renderMessages() {
  const conversation = store.current();
  const box = $('messages');
  $('chat-title').textContent = conversation?.title ?? 'New conversation';
  if (!conversation || conversation.messages.length === 0) {
    box.replaceChildren(el('p', 'empty muted',
                           'Ask something. Replies stream from this server; the KV memory they ' +
                           'use shows on the right.'));
    return;
  }
  const busy = active !== null;
  box.replaceChildren(...conversation.messages.map((m, index) => {
    const node = el('article', `msg ${m.role}`);
    node.dataset.index = String(index);
    node.append(el('div', 'role', m.role === 'user' ? 'You' : 'Model'));
    const content = el('div', 'content');
    content.append(renderMarkdown(m.content));
    if (m.error) content.append(el('p', 'error', m.error));
    node.append(content);
    const footer = el('div', 'footer');
    if (m.role === 'assistant') footer.append(el('span', 'stats', statsText(m)));
    const actions = el('span', 'actions');
    if (m.role === 'user' && !busy) {
      const edit = el('button', 'link', 'Edit');
      edit.type = 'button';
      edit.addEventListener('click', () => startEdit(node, conversation, index));
      actions.append(edit);
    }
    if (m.role === 'assistant' && index === conversation.messages.length - 1 && !busy) {
      const again = el('button', 'link', 'Regenerate');
      again.type = 'button';
      again.addEventListener('click', () => regenerate());
      actions.append(again);
    }
    footer.append(actions);
    node.append(footer);
    return node;
  }));
}

// While a reply streams only its own node changes, at most once a frame: the rest of the page
// keeps its place (no layout jump), and the view follows the reply only if the reader is at the
// bottom already.
function renderStreaming(conversation, index) {
  if (renderQueued) return;
  renderQueued = true;
  requestAnimationFrame(() => {
    renderQueued = false;
    if (store.currentId !== conversation.id) return;
    const node = $('messages').querySelector(`article[data-index="${index}"]`);
    if (!node) return renderMessages();
    const box = $('messages');
    const atBottom = box.scrollHeight - box.scrollTop - box.clientHeight < 40;
    const m = conversation.messages[index];
    const content = node.querySelector('.content');
    content.replaceChildren(renderMarkdown(m.content));
    node.querySelector('.stats').textContent = statsText(m);
    if (atBottom) box.scrollTop = box.scrollHeight;
  });
}

function startEdit(node, conversation, index) {
  const area = el('textarea', 'edit');
  area.value = conversation.messages[index].content;
  area.rows = Math.min(12, area.value.split('\n').length + 1);
  area.ariaLabel = 'Edit message';
  const save = el('button', '', 'Save and continue');
  save.type = 'button';
  const cancel = el('button', 'secondary', 'Cancel');
  cancel.type = 'button';
  const commit = () => {
    if (!area.value.trim()) return;
    // The conversation continues from the edited message: what came after it is replaced.
    conversation.messages = conversation.messages.slice(0, index);
    conversation.messages.push({role: 'user', content: area.value});
    reply(conversation);
  };
  save.addEventListener('click', commit);
  cancel.addEventListener('click', renderMessages);
  area.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      commit();
    } else if (e.key === 'Escape') {
      e.stopPropagation();
      renderMessages();
    }
  });
  const content = node.querySelector('.content');
  const buttons = el('div', 'edit-buttons');
  buttons.append(save, cancel);
  content.replaceChildren(area, buttons);
  area.focus();
}

// ---- Sending ----

function requestParams() {
  const s = store.settings;
  const params = {temperature: Number(s.temperature), top_p: Number(s.top_p)};
  if (Number(s.max_tokens) > 0) params.max_tokens = Math.floor(Number(s.max_tokens));
  return params;
}

function send() {
  const text = $('input').value;
  if (!text.trim() || active) return;
  const conversation = store.current() ?? store.create();
  if (conversation.messages.length === 0) {
    conversation.title = text.trim().split('\n')[0].slice(0, 60);
  }
  conversation.messages.push({role: 'user', content: text});
  $('input').value = '';
  reply(conversation);
}

function regenerate() {
  const conversation = store.current();
  if (!conversation || active) return;
  const last = conversation.messages[conversation.messages.length - 1];
  if (last?.role === 'assistant') conversation.messages.pop();
  reply(conversation);
}

async function reply(conversation) {
  const history = conversation.messages.map(({role, content}) => ({role, content}));
  const system = store.settings.system.trim();
  const messages = system ? [{role: 'system', content: system}, ...history] : history;
  const message = {role: 'assistant', content: '', pending: true};
  conversation.messages.push(message);
  const index = conversation.messages.length - 1;
  conversation.updated = Date.now();
  const controller = new AbortController();
  active = {controller, conversationId: conversation.id};
  store.save();
  renderAll();
  setBusy(true);
  await kvView.replyStarted(conversation.id);
  try {
    const result = await streamChat({
      messages, params: requestParams(), apiKey: store.apiKey, signal: controller.signal,
      onRequestId: (id) => kvView.followRequest(conversation.id, id),
      onText: (piece) => {
        message.content += piece;
        message.stats = {tokens: (message.stats?.tokens ?? 0) + 1, tokens_per_s: null,
                         ttft_ms: message.stats?.ttft_ms ?? null, cached_tokens: null};
        renderStreaming(conversation, index);
      },
    });
    message.content = result.text;
    message.stats = result.stats;
    message.finish_reason = result.finish_reason;
    setStatus(result.stopped ? 'Stopped.' : '');
  } catch (e) {
    message.error = e.message;
    message.finish_reason = 'error';
    setStatus(e.message);
  } finally {
    delete message.pending;
    active = null;
    store.save();
    setBusy(false);
    renderAll();
    await kvView.replyEnded();
    window.kvlWebui.repliesDone += 1;
  }
}

function stopReply() {
  active?.controller.abort();
}

function setBusy(busy) {
  $('send').hidden = busy;
  $('stop').hidden = !busy;
  document.body.dataset.streaming = busy ? 'true' : 'false';
}

function renderAll() {
  renderSidebar();
  renderMessages();
  kvView.setConversation(store.currentId);
  const box = $('messages');
  box.scrollTop = box.scrollHeight;
}

// ---- Settings and keys ----

function bindSettings() {
  const fields = {'system-prompt': 'system', 'temperature': 'temperature', 'top-p': 'top_p',
                  'max-tokens': 'max_tokens'};
  for (const [id, key] of Object.entries(fields)) {
    $(id).value = store.settings[key];
    $(id).addEventListener('input', () => {
      store.settings[key] = $(id).value;
      store.save();
    });
  }
  $('api-key').value = store.apiKey;
  $('api-key').addEventListener('input', () => {
    store.apiKey = $('api-key').value;
    store.save();
    showModel();
  });
}

function bindKeys() {
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  $('input').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  // Esc stops a streaming reply; otherwise it closes an open panel (a phone's conversations or
  // KV memory).
  document.addEventListener('keydown', (e) => {
    if (e.key !== 'Escape') return;
    if (active) {
      e.preventDefault();
      stopReply();
    } else {
      document.body.classList.remove('show-sidebar', 'show-kv');
    }
  });
  $('stop').addEventListener('click', stopReply);
  $('new-chat').addEventListener('click', () => {
    if (!store.current() || store.current().messages.length > 0) store.create();
    selectConversation(store.currentId);
  });
  $('toggle-sidebar').addEventListener('click', () => {
    document.body.classList.toggle('show-sidebar');
  });
  $('toggle-kv').addEventListener('click', () => document.body.classList.toggle('show-kv'));
  $('kv-close').addEventListener('click', () => document.body.classList.remove('show-kv'));
  $('sidebar-close').addEventListener('click', () => {
    document.body.classList.remove('show-sidebar');
  });
}

async function showModel() {
  try {
    const response = await fetch('/v1/models', {headers: authHeaders(store.apiKey)});
    const body = await response.json();
    $('model-name').textContent = response.ok ? body.data[0].id
                                              : body.error?.message ?? `HTTP ${response.status}`;
  } catch (e) {
    $('model-name').textContent = 'server unreachable';
  }
}

const kvView = new KvView({getApiKey: () => store.apiKey, onError: () => {}});
bindSettings();
bindKeys();
renderAll();
kvView.start();
showModel();
$('input').focus();
// What the browser tests reach: the renderer on crafted input, and the page's own state.
window.kvlWebui = {renderMarkdown, store, kvView, repliesDone: 0};
