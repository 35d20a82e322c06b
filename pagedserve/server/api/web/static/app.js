// The page: the chat on the left, the engine's KV cache on the right.

import { loadModels, setUpChat } from "./chat.js";
import { startEngineView } from "./engine.js";

setUpChat();
startEngineView();
loadModels().catch((e) => {
  document.getElementById("server-status").textContent = `cannot list models: ${e.message}`;
});
