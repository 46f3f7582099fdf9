"""lm-evaluation-harness's loglikelihood against llama-server, which cannot echo a prompt's
logprobs (its /v1/completions refuses `echo`): each continuation token is forced in turn
(`logit_bias` on it, one token predicted) and llama-server reports its log-probability in
the model's raw distribution (`n_probs` before sampling), with the most likely token beside
it for the harness's greedy check. The harness splits contexts and continuations and
computes acc / acc_norm as it does for any model (TemplateLM)."""
import json
import urllib.request

from lm_eval.api.model import TemplateLM


def _post(base, path, body, timeout=120):
    req = urllib.request.Request(base + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


class LlamaServerForcedLM(TemplateLM):
    def __init__(self, base_url):
        super().__init__()
        self.base = base_url.rstrip("/")
        with urllib.request.urlopen(self.base + "/props", timeout=30) as r:
            props = json.loads(r.read())
        self._eot = self.tok_encode(props["eos_token"])[0]

    @property
    def eot_token_id(self):
        return self._eot

    def tok_encode(self, string, **kwargs):
        return _post(self.base, "/tokenize", {"content": string, "add_special": False, "parse_special": True})["tokens"]

    def _token_logprob(self, prompt, token):
        out = _post(self.base, "/completion", {"prompt": prompt, "n_predict": 1, "n_probs": 1, "temperature": 0,
                                                "logit_bias": [[token, 1000.0]], "cache_prompt": True})
        p = out["completion_probabilities"][0]
        if p["id"] != token:
            raise RuntimeError(f"llama-server sampled {p['id']}, not the forced token {token}")
        return p["logprob"], p["top_logprobs"][0]["id"] == token

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        res = []
        for _, ctx, cont in requests:
            total, greedy = 0.0, True
            for i, t in enumerate(cont):
                lp, top = self._token_logprob(ctx + cont[:i], t)
                total += lp
                greedy = greedy and top
            res.append((total, greedy))
        return res

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        raise NotImplementedError("loglikelihood_rolling is not part of this bench")

    def generate_until(self, requests, disable_tqdm=False):
        raise NotImplementedError("generation goes through llama-server's OpenAI endpoints")
