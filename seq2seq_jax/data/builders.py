"""tfds builders that need no TensorFlow: Multi30k, a user's own parallel text, and ``tfds:NAME``.

Every source is prepared once into ``array_record`` files under the data dir
(``DataConfig.data_dir``; ``""`` means ``~/.cache/seq2seq_jax/tfds``) and read
back through ``builder.as_data_source()``. Examples are ``{lang: text}`` for the
two languages of the pair; text comes back as UTF-8 bytes.

- ``multi30k``: the official raw files (github.com/multi30k/dataset,
  ``data/task1/raw``, pinned to commit ``MULTI30K_COMMIT``), downloaded when no
  ``manual_dir`` is given and checked against the sha256 of their decompressed
  text, or read from a local copy (``manual_dir``: ``{split}.{lang}`` files,
  plain or ``.gz``). Only the splits that hold both languages of the pair are
  prepared (the full copy has train, val, test_2016_flickr, test_2017_flickr,
  test_2017_mscoco, test_2018_flickr; cs is missing from the 2017 sets).
- ``parallel_text``: ``manual_dir`` holds ``{split}.{source_lang}`` and
  ``{split}.{target_lang}`` files; every split found is prepared.
- ``tfds:NAME``: any tfds dataset whose examples hold the two languages as
  text features (e.g. ``tfds:wmt14_translate/de-en``); tfds downloads it.

A prepared copy of ``multi30k`` or ``parallel_text`` is keyed on the content of
its files (the builder config is ``{lang}-{lang}_{12 hex digits}``, languages
sorted), so the tiny and the full Multi30k prepared into one data dir never mix,
and a download and a local copy of the same official files share one copy.
Evaluation splits keep file order (``disable_shuffling=True``).

Example:
  >>> config = DataConfig(manual_dir="../shared/data/multi30k_tiny", vocab_size=500)
  >>> pairs = load_split(config, "val")  # prepares the corpus once
  Downloading and preparing dataset ...
  >>> pairs[0]
  ('Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen',
   'A group of men are loading cotton onto a truck')
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import pathlib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence

import tensorflow_datasets as tfds

from seq2seq_jax.configs import DataConfig
from seq2seq_jax.data import text_files
from seq2seq_jax.data.text_files import DataError

DEFAULT_DATA_DIR = "~/.cache/seq2seq_jax/tfds"

MULTI30K_COMMIT = "a3d2e0d26b56f3846f66a952536ffed4e401d05a"
MULTI30K_URL = (f"https://raw.githubusercontent.com/multi30k/dataset/{MULTI30K_COMMIT}"
                "/data/task1/raw")
MULTI30K_CITATION = """@inproceedings{elliott-etal-2016-multi30k,
  title = {Multi30K: Multilingual English-German Image Descriptions},
  author = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year = {2016}, pages = {70--74}, url = {https://aclanthology.org/W16-3210}}"""
# sha256 of the decompressed text of every official file at MULTI30K_COMMIT.
MULTI30K_SHA256 = {
    "test_2016_flickr.cs": "45adb85f688de8407fddcbe1b36dca15d12aab868149b337e2576f2d6d2ff8d8",
    "test_2016_flickr.de": "4be6b5b3236b79c25475c6bb829800a7ce559e9ba7a1f6c2394fe4d40be46d16",
    "test_2016_flickr.en": "399a4382932c1aadd3ceb9bef1008d388a64c76d4ae4e9d4728c6f4301cac182",
    "test_2016_flickr.fr": "cb3160d69b002bb638e66cc7612fcd56cb0af82eadc9c142dedc438afb885ef6",
    "test_2017_flickr.de": "c3078bc3b36808bf9d20eb2347ed6137016179ef59ec0d2b9b8ecc3fb2880081",
    "test_2017_flickr.en": "ce1450ddc5ab0834502579d77a170849952e15a2938b34cc503bdc25ebb4fb98",
    "test_2017_flickr.fr": "6f3764e31dac41e9455e612958bcfd4e877c5e15cd66df2c2b2be6d9bd83e5b6",
    "test_2017_mscoco.de": "58277df3c75f92f7145a11b910b553d1cf82c439249d4dc237c899609eafac22",
    "test_2017_mscoco.en": "43051fdfa86fd5395182e718a94ca67b1b227b9f7c79596ff0f6b813216981d2",
    "test_2017_mscoco.fr": "39cde3f43f32b0a6bf29ce4917a46329ff32e53070c2fac87506695a740ae0a0",
    "test_2018_flickr.cs": "1db59fe6980c9b3f9bade65122a985e71150214837d76f4768a5a8384c0b2dc7",
    "test_2018_flickr.de": "39fcc8b3331d76fb42d648d019c6898b0d5e58baac87bc2a0bb93f44ec8db207",
    "test_2018_flickr.en": "4e585c2dd525911a6ea7730e9d0b516239af3f1b1ffae6a2130223cfb639f25e",
    "test_2018_flickr.fr": "234b4a887da0da4801a3e2c6f21336231ff7dd46daeb80cfa1b551c8bbb78239",
    "train.cs": "2be68b38c8d586ff4f54eb13cc6e1baaaa053695b3f070d3038303a47f2268da",
    "train.de": "2c2b73fd2b548fbcde3a875e0a78d6ee94d498bfdee6bd3eae3945779e9ddf72",
    "train.en": "460a15fbd157e34a7a9957ee388c1ca247fe47af3ef25fb50442af6c274e0fc6",
    "train.fr": "5925a3c18f1587b6b54b87743106e6e8ab93618edb6f65d19eac0621f853a10d",
    "val.cs": "d53827e469b0a1ca8d57e9e26b2b64c4bc4b33f5479c7b03ae87ae5c882c3e33",
    "val.de": "660e09eb7e1da2f856ea13ee5ad3cf6d36b3d5b0b733c857e94c5747a3dfc660",
    "val.en": "1f2a23d992769b5b3d209b0a10dd0b77c08cceb1f20dfb97ed0aafa49d107227",
    "val.fr": "5304e444d842e962b2dda4d816b70b22a1765b15401642b7ca37a67477e708dc",
}

Fetcher = Callable[[str], bytes]

_BLOCK = 4096  # records a TextPairs reads at once when iterated

_log = logging.getLogger(__name__)


def default_data_dir() -> str:
  return os.path.expanduser(DEFAULT_DATA_DIR)


def resolve_data_dir(data_config: DataConfig) -> str:
  """``data_config.data_dir`` expanded, or the default ``~/.cache/seq2seq_jax/tfds``."""
  return os.path.expanduser(data_config.data_dir) if data_config.data_dir else default_data_dir()


@dataclasses.dataclass(eq=False)
class AlignedTextConfig(tfds.core.BuilderConfig):
  """One language pair of one set of files; ``name`` carries the files' content key."""

  langs: tuple[str, ...] = ()  # the two languages, sorted
  files: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)  # split -> lang -> path
  download_url: str = ""  # multi30k only: fetch the official files from here first
  download_dir: str = ""


class _AlignedTextBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Shared by ``Multi30k`` and ``ParallelText``: line i of every file is example i."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "First release."}

  # tfds looks for a checksums file beside a builder defined in a package, and on
  # Python >= 3.9 that lookup imports `importlib_resources`, which tfds does not
  # install: it fails. Our checksums are ours (MULTI30K_SHA256), so there is no file.
  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls):
    return None

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
        builder=self,
        description=self.__doc__,
        features=tfds.features.FeaturesDict(
            {lang: tfds.features.Text() for lang in self.builder_config.langs}),
        disable_shuffling=True,  # evaluation hypotheses must line up with the reference files
        homepage=getattr(self, "HOMEPAGE", None),
        citation=getattr(self, "CITATION", None),
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # reading and downloading are ours: checksums are on decompressed text
    config = self.builder_config
    if config.download_url:
      _download_multi30k(config.download_dir, config.files, url=config.download_url)
    # Read and check every split before tfds writes anything, so bad input fails cleanly.
    texts = {split: text_files.read_aligned(paths) for split, paths in config.files.items()}
    return {split: self._generate_examples(lines) for split, lines in texts.items()}

  def _generate_examples(self, lines: dict[str, list[str]]):
    langs = self.builder_config.langs
    for index, pair in enumerate(zip(*(lines[lang] for lang in langs))):
      yield index, dict(zip(langs, pair))


class Multi30k(_AlignedTextBuilder, skip_registration=True):
  """Multi30k task 1 (Elliott et al. 2016): image descriptions in en, de, fr, cs."""

  HOMEPAGE = "https://github.com/multi30k/dataset"
  CITATION = MULTI30K_CITATION


class ParallelText(_AlignedTextBuilder, skip_registration=True):
  """A user's own parallel text: {split}.{lang} files, one sentence per line."""


def _fetch_url(url: str) -> bytes:
  with urllib.request.urlopen(url, timeout=60) as response:
    return response.read()


def download_multi30k(directory: str | pathlib.Path, langs: Sequence[str], *,
                      url: str = MULTI30K_URL, fetch: Fetcher | None = None,
                      splits: Sequence[str] | None = None) -> dict[str, dict[str, str]]:
  """Downloads the official Multi30k files of ``langs`` and checks their checksums.

  Each ``{split}.{lang}.gz`` is fetched from ``url``, decompressed, checked against
  ``MULTI30K_SHA256`` and written as ``directory/{split}.{lang}``; a file already
  there with the right checksum is kept.

  Args:
    directory: where the decompressed text goes.
    langs: languages wanted; only splits holding all of them are fetched.
    url: base URL (``https://...`` or ``file://...``) of the ``.gz`` files.
    fetch: ``url -> bytes``; defaults to ``urllib``.
    splits: restrict to these splits (default: all official splits).

  Returns:
    ``{split: {lang: path}}`` of the files written.

  Raises:
    DataError: a fetch failed (no internet: use ``manual_dir``), or a file's
      checksum does not match (named, with the expected and actual sha256).
  """
  files = _official_files(langs, splits, directory=str(directory))
  _download_multi30k(str(directory), files, url=url, fetch=fetch)
  return files


def _official_files(langs: Sequence[str], splits: Sequence[str] | None = None,
                    directory: str = "") -> dict[str, dict[str, str]]:
  present: dict[str, dict[str, str]] = {}
  for name in MULTI30K_SHA256:
    split, lang = name.rsplit(".", 1)
    if lang in langs and (splits is None or split in splits):
      present.setdefault(split, {})[lang] = os.path.join(directory, name)
  return {split: {lang: paths[lang] for lang in langs}
          for split, paths in present.items() if len(paths) == len(langs)}


def _download_multi30k(directory: str, files: dict[str, dict[str, str]], *, url: str,
                       fetch: Fetcher | None = None) -> None:
  fetch = fetch or _fetch_url
  os.makedirs(directory, exist_ok=True)
  for paths in files.values():
    for path in paths.values():
      name = os.path.basename(path)
      dest = pathlib.Path(directory) / name
      expected = MULTI30K_SHA256[name]
      if dest.exists() and text_files.sha256(dest.read_bytes()) == expected:
        continue
      source = f"{url.rstrip('/')}/{name}.gz"
      try:
        compressed = fetch(source)
      except (urllib.error.URLError, OSError) as e:
        raise DataError(
            f"could not download {source} ({e}); without internet, pass the raw files as "
            "DataConfig.manual_dir (seq2seq-jax prepare --manual-dir PATH, e.g. "
            "../shared/data/multi30k/raw)") from e
      text = text_files.gunzip(compressed, source)
      actual = text_files.sha256(text)
      if actual != expected:
        raise DataError(
            f"{name}.gz from {url}: checksum mismatch: the decompressed text has sha256 "
            f"{actual}, expected {expected}; the download is corrupt or the upstream file "
            "changed: try again, or pass a checked local copy as manual_dir")
      partial = dest.with_name(name + ".partial")
      partial.write_bytes(text)
      partial.replace(dest)


@contextlib.contextmanager
def _quiet_custom_config_warning():
  """tfds logs 'Using custom data configuration' for every config built at run time."""
  absl_logger = logging.getLogger("absl")

  def drop(record: logging.LogRecord) -> bool:
    return "custom data configuration" not in record.getMessage()

  absl_logger.addFilter(drop)
  try:
    yield
  finally:
    absl_logger.removeFilter(drop)


def _aligned_text_config(data_config: DataConfig, *, multi30k_url: str) -> AlignedTextConfig:
  langs = tuple(sorted((data_config.source_lang, data_config.target_lang)))
  download_url = download_dir = ""
  if not data_config.manual_dir:  # only Multi30k has files without one: the official ones
    if data_config.dataset != "multi30k":
      raise DataError(f"DataConfig.dataset={data_config.dataset!r} reads the user's own files: "
                      "set DataConfig.manual_dir (--manual-dir) to the folder of {split}.{lang} "
                      "files")
    download_dir = os.path.join(resolve_data_dir(data_config), "downloads", "multi30k",
                                MULTI30K_COMMIT[:12])
    files = _official_files(langs, directory=download_dir)
    if not files:
      raise DataError(f"Multi30k has no split in both {langs[0]} and {langs[1]}: set "
                      "DataConfig.source_lang / target_lang to two of en, de, fr, cs")
    checksums = {os.path.basename(path): MULTI30K_SHA256[os.path.basename(path)]
                 for paths in files.values() for path in paths.values()}
    download_url = multi30k_url
  else:
    found = text_files.split_files(data_config.manual_dir, langs)
    if data_config.dataset == "parallel_text":
      for split, paths in found.items():
        if len(paths) != len(langs):
          (have,), (missing,) = paths, set(langs) - set(paths)
          raise DataError(
              f"{paths[have]} has no partner file {split}.{missing} in {data_config.manual_dir}: "
              f"add it, or move {os.path.basename(paths[have])} out of the folder")
    files = {split: {lang: str(path) for lang, path in paths.items()}
             for split, paths in found.items() if len(paths) == len(langs)}
    if not files:
      raise DataError(
          f"{data_config.manual_dir} has no split with both {langs[0]} and {langs[1]} files "
          f"({{split}}.{langs[0]} and {{split}}.{langs[1]}, plain or .gz): check "
          "DataConfig.manual_dir, source_lang and target_lang")
    checksums = {f"{split}.{lang}": text_files.sha256(text_files.read_bytes(path))
                 for split, paths in files.items() for lang, path in paths.items()}
  key = text_files.content_key(checksums)
  return AlignedTextConfig(
      name=f"{langs[0]}-{langs[1]}_{key}",
      description=f"{'-'.join(langs)} from files with content key {key}",
      langs=langs, files=files, download_url=download_url, download_dir=download_dir)


def get_builder(data_config: DataConfig, *,
                multi30k_url: str = MULTI30K_URL) -> tfds.core.DatasetBuilder:
  """The tfds builder of ``data_config``'s corpus (not necessarily prepared yet)."""
  data_dir = resolve_data_dir(data_config)
  dataset = data_config.dataset
  if dataset in ("multi30k", "parallel_text"):
    config = _aligned_text_config(data_config, multi30k_url=multi30k_url)
    cls = Multi30k if dataset == "multi30k" else ParallelText
    with _quiet_custom_config_warning():
      return cls(config=config, data_dir=data_dir, file_format="array_record")
  if dataset.startswith("tfds:"):
    name = dataset[len("tfds:"):]
    with contextlib.suppress(ImportError):
      import tensorflow_datasets.translate  # noqa: F401  registers wmt*, ted_* builders
    try:
      return tfds.builder(name, data_dir=data_dir, file_format="array_record")
    except tfds.core.registered.DatasetNotFoundError as e:
      raise DataError(f"DataConfig.dataset={dataset!r}: tfds has no dataset {name!r}; "
                      "check the name (e.g. tfds:wmt14_translate/de-en)") from e
  raise DataError(f"DataConfig.dataset={dataset!r}: use 'multi30k', 'parallel_text' or "
                  "'tfds:NAME'")


def prepare_dataset(data_config: DataConfig, *,
                    multi30k_url: str = MULTI30K_URL) -> tfds.core.DatasetBuilder:
  """Prepares ``data_config``'s corpus once (download, check, write array_record).

  Args:
    data_config: ``dataset``, ``manual_dir``, ``data_dir`` and the language pair.
    multi30k_url: where the official Multi30k ``.gz`` files are fetched from
      when ``manual_dir`` is empty (``file://`` works too).

  Returns:
    The prepared builder; ``builder.info.splits`` lists the splits.

  Raises:
    DataError: bad input files, a failed download or checksum, a dataset whose
      features do not hold both languages.
  """
  return prepare_builder(get_builder(data_config, multi30k_url=multi30k_url), data_config)


def prepare_builder(builder: tfds.core.DatasetBuilder,
                    data_config: DataConfig) -> tfds.core.DatasetBuilder:
  """``prepare_dataset`` with the builder made already (``sources.SplitSource.builder``)."""
  download_config = tfds.download.DownloadConfig(
      manual_dir=os.path.expanduser(data_config.manual_dir) if data_config.manual_dir else None)
  builder.download_and_prepare(file_format="array_record", download_config=download_config)
  features = builder.info.features
  missing = [lang for lang in (data_config.source_lang, data_config.target_lang)
             if lang not in features.keys()]
  if missing:
    raise DataError(f"{data_config.dataset} has the features {sorted(features.keys())}, not "
                    f"{missing}: set DataConfig.source_lang / target_lang to two of them")
  return builder


class TextPairs:
  """Random access to (source, target) sentence pairs of one prepared split.

  A grain ``RandomAccessDataSource``: ``len(pairs)``, ``pairs[i] -> (source: str,
  target: str)`` in file order; iterating it reads them in that order, 4096 records a
  read.
  """

  def __init__(self, source, source_lang: str, target_lang: str, *, name: str = ""):
    self._source = source
    self.source_lang = source_lang
    self.target_lang = target_lang
    self.name = name

  def __len__(self) -> int:
    return len(self._source)

  def __getitem__(self, index: int) -> tuple[str, str]:
    return self._pair(self._source[index])

  def __getitems__(self, indices: Sequence[int]) -> list[tuple[str, str]]:
    if not len(indices):
      return []
    return [self._pair(record) for record in self._source.__getitems__(list(indices))]

  def __iter__(self) -> Iterator[tuple[str, str]]:
    for start in range(0, len(self), _BLOCK):
      yield from self.__getitems__(range(start, min(start + _BLOCK, len(self))))

  def _pair(self, record) -> tuple[str, str]:
    return _text(record[self.source_lang]), _text(record[self.target_lang])

  def __repr__(self) -> str:
    return f"TextPairs({self.name}, {len(self)} pairs, {self.source_lang}->{self.target_lang})"


def _text(value) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def load_split(data_config: DataConfig, split: str, *,
               multi30k_url: str = MULTI30K_URL) -> TextPairs:
  """The pairs of one split in file order, preparing the corpus first if needed.

  Args:
    data_config: which corpus and language pair.
    split: e.g. ``"train"``, ``"val"``, ``"test_2016_flickr"``.

  Returns:
    ``TextPairs``: ``pairs[i] == (source sentence, target sentence)``.
  """
  return split_pairs(prepare_dataset(data_config, multi30k_url=multi30k_url), data_config, split)


def split_pairs(builder: tfds.core.DatasetBuilder, data_config: DataConfig,
                split: str) -> TextPairs:
  """``load_split`` of a prepared builder."""
  if split not in builder.info.splits:
    raise DataError(f"{data_config.dataset} has no split {split!r}; it has "
                    f"{', '.join(sorted(builder.info.splits))}: set DataConfig.train_split / "
                    "eval_split to one of them")
  source = builder.as_data_source(split=split)
  config_name = f"/{builder.builder_config.name}" if builder.builder_config else ""
  return TextPairs(source, data_config.source_lang, data_config.target_lang,
                   name=f"{builder.name}{config_name}:{split}")
