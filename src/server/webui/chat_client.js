// One streamed chat completion through the server's own /v1/chat/completions (server-sent
// events), with the figures a reply shows: tokens, tok/s, time to first token, cached prompt
// tokens (from the usage frame, asked for with stream_options.include_usage).

export function authHeaders(apiKey) {
  return apiKey ? {Authorization: `Bearer ${apiKey}`} : {};
}

// Streams a reply to `messages` ([{role, content}]). `onText(piece)` gets each frame's text;
// aborting `signal` stops the reply (the server cancels the request when the connection closes).
// Resolves to {text, finish_reason, stopped, stats: {tokens, tokens_per_s, ttft_ms,
// prompt_tokens, cached_tokens}}; rejects with an Error naming the server's message.
export async function streamChat({messages, params, apiKey, signal, onText, onRequestId}) {
  const body = {messages, stream: true, stream_options: {include_usage: true}, ...params};
  const started = performance.now();
  let response;
  try {
    response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: {'Content-Type': 'application/json', ...authHeaders(apiKey)},
      body: JSON.stringify(body),
      signal,
    });
  } catch (e) {
    if (signal.aborted) return finish({stopped: true});
    throw new Error(`cannot reach the server: ${e.message}`);
  }
  if (!response.ok) {
    let message = `HTTP ${response.status}`;
    try {
      message = (await response.json()).error?.message ?? message;
    } catch { /* not JSON: keep the status */ }
    throw new Error(message);
  }
  // The engine's number for this request (X-Request-Id): the KV view follows exactly its pages.
  const requestId = Number(response.headers.get('X-Request-Id'));
  if (Number.isInteger(requestId) && requestId > 0) onRequestId?.(requestId);
  let text = '';
  let frames = 0;
  let firstAt = 0;
  let lastAt = 0;
  let finishReason = null;
  let usage = null;
  const decoder = new TextDecoder();
  const reader = response.body.getReader();
  let buffer = '';

  function finish({stopped}) {
    const tokens = usage?.completion_tokens ?? frames;
    // Frames arrive in network reads: a reply faster than a few reads (a tiny model) has no
    // decode time to speak of, and its rate is taken from the request's start instead.
    const decodeMs = lastAt - firstAt;
    const rate = decodeMs >= 50 ? ((tokens - 1) * 1000) / decodeMs
                                : lastAt > started ? (tokens * 1000) / (lastAt - started) : null;
    return {
      text,
      finish_reason: stopped ? 'stopped' : finishReason,
      stopped,
      stats: {
        tokens,
        frames,  // frames that carried text: one per token as the server streams them
        // Tokens after the first over the time they took: the decode rate, apart from TTFT.
        tokens_per_s: tokens > 1 ? rate : null,
        ttft_ms: firstAt ? firstAt - started : null,
        prompt_tokens: usage?.prompt_tokens ?? null,
        cached_tokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
      },
    };
  }

  for (;;) {
    let chunk;
    try {
      chunk = await reader.read();
    } catch (e) {
      if (signal.aborted) return finish({stopped: true});
      throw new Error(`the stream broke: ${e.message}`);
    }
    if (chunk.done) break;
    buffer += decoder.decode(chunk.value, {stream: true});
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const frame = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of frame.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return finish({stopped: false});
        const event = JSON.parse(data);
        if (event.error) throw new Error(event.error.message ?? 'server error');
        if (event.usage) usage = event.usage;
        const choice = event.choices?.[0];
        if (!choice) continue;
        if (choice.finish_reason) finishReason = choice.finish_reason;
        const piece = choice.delta?.content;
        if (piece) {
          const now = performance.now();
          if (!firstAt) firstAt = now;
          lastAt = now;
          ++frames;
          text += piece;
          onText(piece);
        }
      }
    }
  }
  return finish({stopped: signal.aborted});
}
