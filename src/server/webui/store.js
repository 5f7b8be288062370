// Conversations and settings, kept in the browser (localStorage) so that they survive a reload.
// The API key is kept for the tab only (sessionStorage): it is a secret, the rest is not.

const kConversationsKey = 'kvl.conversations.v1';
const kSettingsKey = 'kvl.settings.v1';
const kApiKeyKey = 'kvl.api_key.v1';

export const kDefaultSettings = {system: '', temperature: 0.7, top_p: 1, max_tokens: 256};

function readJson(storage, key, fallback) {
  try {
    const text = storage.getItem(key);
    return text === null ? fallback : JSON.parse(text);
  } catch {
    return fallback;  // a damaged entry starts over rather than breaking the page
  }
}

export class Store {
  constructor() {
    const saved = readJson(localStorage, kConversationsKey, {conversations: [], current: null});
    this.conversations = Array.isArray(saved.conversations) ? saved.conversations : [];
    this.currentId = saved.current;
    // A reply that was streaming when the page went away ended there.
    for (const c of this.conversations) {
      for (const m of c.messages ?? []) {
        if (!m.pending) continue;
        delete m.pending;
        m.finish_reason = 'interrupted';
      }
    }
    this.settings = {...kDefaultSettings, ...readJson(localStorage, kSettingsKey, {})};
    this.apiKey = sessionStorage.getItem(kApiKeyKey) ?? '';
  }

  save() {
    try {
      localStorage.setItem(kConversationsKey, JSON.stringify(
          {conversations: this.conversations, current: this.currentId}));
      localStorage.setItem(kSettingsKey, JSON.stringify(this.settings));
      sessionStorage.setItem(kApiKeyKey, this.apiKey);
    } catch (e) {
      console.warn('kvl: cannot save conversations', e);  // storage full or disabled
    }
  }

  current() {
    return this.conversations.find((c) => c.id === this.currentId) ?? null;
  }

  create() {
    const now = Date.now();
    const conversation = {id: `c${now.toString(36)}${Math.random().toString(36).slice(2, 7)}`,
                          title: 'New conversation', messages: [], created: now, updated: now};
    this.conversations.unshift(conversation);
    this.currentId = conversation.id;
    this.save();
    return conversation;
  }

  select(id) {
    if (this.conversations.some((c) => c.id === id)) this.currentId = id;
    this.save();
  }

  rename(id, title) {
    const c = this.conversations.find((x) => x.id === id);
    if (c && title.trim()) c.title = title.trim().slice(0, 120);
    this.save();
  }

  remove(id) {
    this.conversations = this.conversations.filter((c) => c.id !== id);
    if (this.currentId === id) this.currentId = this.conversations[0]?.id ?? null;
    this.save();
  }
}
