// Drives kvl serve's chat page in headless Chromium (puppeteer-core) and prints what it saw as
// one JSON line; tests/webui/webui_browser_test.cc asserts on it. Nothing is judged here beyond
// waiting for the page: each step reports what it measured.
//
//   node webui_check.mjs --mode chat|stop --url http://127.0.0.1:PORT --chromium /usr/bin/chromium
//        [--screenshots DIR] [--max-tokens N]
import {createRequire} from 'node:module';
import path from 'node:path';

const args = Object.fromEntries(process.argv.slice(2).reduce((pairs, arg, i, all) => {
  if (arg.startsWith('--')) pairs.push([arg.slice(2), all[i + 1]]);
  return pairs;
}, []));
// puppeteer-core is installed by the test into a folder of its own (KVL_WEBUI_NODE_DIR).
const require = createRequire(path.join(process.env.KVL_WEBUI_NODE_DIR, 'node_modules', 'x.js'));
const puppeteer = require('puppeteer-core');

const report = {mode: args.mode, page_errors: []};
const kStepTimeoutMs = 60000;

// The page is ready once its first KV poll answered (it polls forever: never network-idle).
async function load(page, how = 'goto') {
  if (how === 'goto') {
    await page.goto(args.url, {waitUntil: 'load'});
  } else {
    await page.reload({waitUntil: 'load'});
  }
  await page.waitForFunction(() => document.getElementById('kv-live').textContent === '(live)',
                             {timeout: kStepTimeoutMs});
}

async function setField(page, selector, value) {
  await page.click(selector, {clickCount: 3});
  await page.keyboard.press('Backspace');
  await page.type(selector, String(value));
}

// Types `text` into the composer and sends it with Enter; resolves once the reply has finished,
// with the texts the reply showed while it streamed (sampled at every DOM change).
async function sendAndWatch(page, text) {
  const done = await page.evaluate(() => window.kvlWebui.repliesDone);
  await page.evaluate(() => {
    window.__seen = [];
    window.__composerTops = [];
    const box = document.getElementById('messages');
    window.__observer?.disconnect();
    window.__observer = new MutationObserver(() => {
      const replies = box.querySelectorAll('article.msg.assistant .content');
      const last = replies[replies.length - 1];
      if (last) window.__seen.push(last.textContent);
      window.__composerTops.push(document.getElementById('composer').getBoundingClientRect().top);
    });
    window.__observer.observe(box, {childList: true, subtree: true, characterData: true});
  });
  await page.focus('#input');
  // Typed as keys, with Enter as the only way it is sent (keyboard-only use).
  await page.keyboard.type(text);
  await page.keyboard.press('Enter');
  await page.waitForFunction((n) => window.kvlWebui.repliesDone > n, {timeout: kStepTimeoutMs},
                             done);
  return page.evaluate(() => {
    window.__observer.disconnect();
    const m = window.kvlWebui.store.current().messages;
    const last = m[m.length - 1];
    return {text: last.content, finish_reason: last.finish_reason, stats: last.stats,
            messages_sent: m.slice(0, -1).map(({role, content}) => ({role, content})),
            error: last.error ?? null, seen: window.__seen, composer_tops: window.__composerTops,
            stats_line: document.querySelector('article.msg.assistant:last-of-type .stats')?.textContent};
  });
}

// Runs `act` (a click that starts a reply) and waits for the reply; the conversation after it.
async function clickAndWatch(page, act) {
  const before = await page.evaluate(() => window.kvlWebui.store.current().messages.length);
  const done = await page.evaluate(() => window.kvlWebui.repliesDone);
  await act();
  await page.waitForFunction((n) => window.kvlWebui.repliesDone > n, {timeout: kStepTimeoutMs},
                             done);
  return page.evaluate((n) => ({
    before: n,
    messages: window.kvlWebui.store.current().messages.map(
        ({role, content, finish_reason}) => ({role, content, finish_reason})),
  }), before);
}

// The KV view's figures as the page shows them (data-value holds the raw number).
async function kvFigures(page) {
  // Two polls, so that the figures include the last request.
  await new Promise((r) => setTimeout(r, 1200));
  return page.evaluate(() => ({
    hit_tokens: Number(document.getElementById('kv-hit-tokens').dataset.value),
    hit_rate: Number(document.getElementById('kv-hit-rate').dataset.value),
    query_tokens: Number(document.getElementById('kv-query-tokens').dataset.value),
    finished: Number(document.getElementById('kv-requests').dataset.value),
    pool: {...document.getElementById('kv-pool-legend').dataset},
    grid_cells: document.querySelectorAll('#kv-pool-grid .cell').length,
    seq_pages: Number(document.getElementById('kv-seq-pages').dataset.pages ?? 0),
    seq_page_cells: [...document.querySelectorAll('#kv-seq-pages .cell')].map((c) => c.className),
    seq_caption: document.getElementById('kv-seq-caption').textContent,
    actions: Object.fromEntries([...document.querySelectorAll('#kv-actions tbody tr')].map(
        (row) => [row.dataset.action, Number(row.children[1].textContent)])),
    tiers: [...document.querySelectorAll('#kv-tiers tbody tr')].map((row) => row.textContent),
    live: document.getElementById('kv-live').textContent,
  }));
}

async function screenshot(page, name, width, height) {
  if (!args.screenshots) return;
  await page.setViewport({width, height});
  await new Promise((r) => setTimeout(r, 300));
  await page.screenshot({path: path.join(args.screenshots, name)});
  report.screenshots = [...(report.screenshots ?? []), name];
}

async function chatMode(page) {
  const maxTokens = Number(args['max-tokens'] ?? 200);
  await load(page);
  report.title = await page.title();
  // Greedy settings, typed into the settings panel.
  await page.click('#settings summary');
  await setField(page, '#temperature', 0);
  await setField(page, '#max-tokens', maxTokens);
  await page.click('#settings summary');

  // Shift+Enter is a new line, not a send.
  await page.focus('#input');
  await page.keyboard.type('one');
  await page.keyboard.down('Shift');
  await page.keyboard.press('Enter');
  await page.keyboard.up('Shift');
  await page.keyboard.type('two');
  report.shift_enter = await page.evaluate(() => ({
    value: document.getElementById('input').value,
    conversations: window.kvlWebui.store.conversations.length}));
  await page.evaluate(() => { document.getElementById('input').value = ''; });

  // A prompt of several KV blocks, so that a second conversation starting the same way finds
  // whole blocks of it in the prefix cache.
  const first = 'Once upon a time, there was a little girl named Lily. She loved to play outside ' +
                'in the park with her friends and her big red ball. One day';
  report.first_message = first;
  report.reply = await sendAndWatch(page, first);
  report.kv_after_first = await kvFigures(page);

  // A reload finds the conversation, its reply and its title.
  await load(page, 'reload');
  report.after_reload = await page.evaluate(() => ({
    conversations: [...document.querySelectorAll('#conversations li .title')].map((b) => b.textContent),
    messages: [...document.querySelectorAll('#messages article')].map((a) => ({
      role: a.classList.contains('user') ? 'user' : 'assistant',
      text: a.querySelector('.content').textContent})),
    stored_reply: window.kvlWebui.store.current()?.messages[1]?.content,
  }));

  // A second conversation that starts the same way: its prompt's blocks come from the cache.
  await page.click('#new-chat');
  report.second = await sendAndWatch(page, first);
  report.kv_after_second = await kvFigures(page);
  report.conversations_after_second = await page.evaluate(
      () => window.kvlWebui.store.conversations.length);

  // Regenerate the last reply (greedy: the same text again, in place of the old one).
  report.regenerated = await clickAndWatch(page, async () => {
    await page.click('article.msg.assistant:last-of-type .actions .link');
  });
  // Edit the first message and continue from it: what came after it is replaced.
  report.edited_message = 'Once upon a time, there was a little boy named Tim.';
  report.edited = await clickAndWatch(page, async () => {
    await page.click('article.msg.user .actions .link');
    await page.keyboard.down('Control');
    await page.keyboard.press('a');
    await page.keyboard.up('Control');
    await page.keyboard.type(report.edited_message);
    await page.keyboard.press('Enter');
  });

  // Renaming and deleting a conversation, by the sidebar's buttons and keys.
  await page.click('#conversations li.current .icon');  // the first icon: rename
  await page.keyboard.down('Control');
  await page.keyboard.press('a');
  await page.keyboard.up('Control');
  await page.keyboard.type('Shared prefix');
  await page.keyboard.press('Enter');
  report.renamed = await page.evaluate(() => window.kvlWebui.store.current().title);

  // Untrusted text: a message holding markup is shown as text and runs nothing, and the
  // renderer given crafted markdown builds no element from it.
  const hostile = 'Say <script>window.__xss = 1</script> and <img src=x onerror="window.__xss = 2">';
  report.hostile = await sendAndWatch(page, hostile);
  report.xss = await page.evaluate(async (text) => {
    const box = document.getElementById('messages');
    const probe = document.createElement('div');
    probe.className = 'msg assistant';
    probe.append(window.kvlWebui.renderMarkdown(
        '**bold** <img src=x onerror="window.__xss=3"> [link](javascript:window.__xss=4)\n' +
        '```html\n<script>window.__xss = 5</script>\n```\n' +
        '- <b onmouseover="window.__xss=6">item</b>\n`<svg onload="window.__xss=7">`'));
    box.append(probe);
    await new Promise((r) => setTimeout(r, 300));
    const user = [...box.querySelectorAll('article.msg.user .content')].pop();
    return {
      xss: window.__xss ?? null,
      elements_in_messages: box.querySelectorAll('script, img, svg, iframe, b, [onerror], [onload]').length,
      links: [...probe.querySelectorAll('a')].map((a) => a.getAttribute('href')),
      user_text: user.textContent,
      user_expected: text,
      probe_text: probe.textContent,
      probe_tags: [...probe.querySelectorAll('*')].map((n) => n.tagName.toLowerCase()),
    };
  }, hostile);
  await page.evaluate(() => document.querySelector('#messages > div.msg.assistant')?.remove());

  // Usable at 360 px: nothing wider than the screen.
  await page.setViewport({width: 360, height: 740});
  await new Promise((r) => setTimeout(r, 300));
  report.at_360 = await page.evaluate(() => ({
    scroll_width: document.documentElement.scrollWidth,
    input_visible: document.getElementById('input').getBoundingClientRect().bottom <= 740,
  }));

  // Screenshots: the conversation with a shared prefix, the KV view beside it.
  await page.evaluate(() => {
    const first = window.kvlWebui.store.conversations.find((c) => c.title === 'Shared prefix');
    document.querySelector(`#conversations li[data-id="${first.id}"] .title`).click();
  });
  await page.emulateMediaFeatures([{name: 'prefers-color-scheme', value: 'light'}]);
  await screenshot(page, 'webui-1280.png', 1280, 1000);
  report.light_background = await page.evaluate(
      () => getComputedStyle(document.body).backgroundColor);
  await screenshot(page, 'webui-390.png', 390, 844);
  await page.click('#toggle-kv');
  await screenshot(page, 'webui-390-kv.png', 390, 844);
  report.kv_panel_390 = await page.evaluate(() => {
    const kv = document.getElementById('kv');
    return {shown: kv.getBoundingClientRect().width > 0, scroll_width: kv.scrollWidth,
            client_width: kv.clientWidth};
  });
  await page.click('#kv-close');
  report.kv_panel_closed = await page.evaluate(
      () => document.getElementById('kv').getBoundingClientRect().width === 0);
  await page.emulateMediaFeatures([{name: 'prefers-color-scheme', value: 'dark'}]);
  await screenshot(page, 'webui-1280-dark.png', 1280, 1000);
  report.dark_background = await page.evaluate(
      () => getComputedStyle(document.body).backgroundColor);

  // Deleting the renamed conversation.
  await page.evaluate(() => {
    const first = window.kvlWebui.store.conversations.find((c) => c.title === 'Shared prefix');
    document.querySelector(`#conversations li[data-id="${first.id}"] .icon:last-child`).click();
  });
  report.after_delete = await page.evaluate(
      () => window.kvlWebui.store.conversations.map((c) => c.title));
}

// On a model slow enough to watch (a TinyLlama-shaped synth): a short greedy reply seen growing
// token by token, then a long reply stopped with Esc after its first tokens.
async function stopMode(page) {
  await load(page);
  await page.click('#settings summary');
  await setField(page, '#temperature', 0);
  await setField(page, '#max-tokens', args['max-tokens'] ?? 12);
  report.first_message = 'Hello';
  report.reply = await sendAndWatch(page, report.first_message);

  await page.click('#new-chat');
  await setField(page, '#max-tokens', 400);
  await page.focus('#input');
  await page.keyboard.type('Tell me a long story.');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => {
    const m = window.kvlWebui.store.current()?.messages;
    return m && m.length === 2 && m[1].content.length > 0;
  }, {timeout: kStepTimeoutMs});
  report.stop_shown = await page.evaluate(() => !document.getElementById('stop').hidden);
  const stoppedAt = Date.now();
  await page.keyboard.press('Escape');
  await page.waitForFunction(() => !document.querySelector('body[data-streaming="true"]'),
                             {timeout: kStepTimeoutMs});
  report.stopped = await page.evaluate(() => {
    const m = window.kvlWebui.store.current().messages;
    const last = m[m.length - 1];
    return {finish_reason: last.finish_reason, tokens: last.stats?.tokens, text: last.content,
            send_shown: !document.getElementById('send').hidden,
            status: document.getElementById('status').textContent};
  });
  // The server let the request go: nothing runs a moment after the stop.
  report.after_stop = await page.evaluate(async () => {
    for (let i = 0; i < 100; ++i) {
      const state = await (await fetch('/v1/kv/state')).json();
      if (state.requests.running === 0) {
        return {running: 0, finished: state.requests.finished,
                tokens_generated: state.requests.tokens_generated};
      }
      await new Promise((r) => setTimeout(r, 50));
    }
    return {running: -1};
  });
  report.stop_to_idle_ms = Date.now() - stoppedAt;
  report.kv = await kvFigures(page);
}

// A server with an API key: the page says what is missing until the key is typed in its
// settings, then chats and shows the KV memory.
async function keyMode(page) {
  await page.goto(args.url, {waitUntil: 'load'});
  await page.waitForFunction(() => document.getElementById('kv-live').textContent.includes('unavailable'),
                             {timeout: kStepTimeoutMs});
  report.without_key = await page.evaluate(() => document.getElementById('kv-live').textContent);
  await page.click('#settings summary');
  await setField(page, '#max-tokens', 8);
  report.refused = await sendAndWatch(page, 'Once upon a time');
  await setField(page, '#api-key', args.key);
  await page.waitForFunction(() => document.getElementById('kv-live').textContent === '(live)',
                             {timeout: kStepTimeoutMs});
  report.with_key = await clickAndWatch(page, async () => {
    await page.click('article.msg.assistant:last-of-type .actions .link');  // Regenerate
  });
  // The key is kept for the tab (sessionStorage), not with the conversations.
  report.key_in_local_storage = await page.evaluate(
      (key) => Object.values(localStorage).some((v) => v.includes(key)), args.key);
}

const browser = await puppeteer.launch({
  executablePath: args.chromium,
  headless: true,
  // No sandbox: CI containers run as root, where Chromium's sandbox cannot start.
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', '--no-first-run'],
});
try {
  const page = await browser.newPage();
  await page.setViewport({width: 1280, height: 800});
  page.on('pageerror', (e) => report.page_errors.push(String(e.message ?? e)));
  page.on('console', (m) => {
    if (m.type() === 'error') report.page_errors.push(m.text());
  });
  if (args.mode === 'stop') {
    await stopMode(page);
  } else if (args.mode === 'key') {
    await keyMode(page);
  } else {
    await chatMode(page);
  }
  report.ok = true;
} catch (e) {
  report.ok = false;
  report.error = String(e.stack ?? e);
} finally {
  await browser.close();
}
console.log(JSON.stringify(report));
