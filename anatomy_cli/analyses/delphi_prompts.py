"""delphi's prompt texts, byte for byte (EleutherAI/delphi, eai-delphi 0.1.3): the default explainer's system prompt
and worked examples (``delphi/explainers/default/prompts.py``), the detection and fuzzing scorers' system prompts,
worked examples and the generation prompt (``delphi/scorers/classifier/prompts/{detection,fuzz}_prompt.py``; the
two generation prompts are the same text). Data only: :mod:`anatomy_cli.analyses.explain_prompts` builds the
messages. tests/test_explain.py compares them with delphi's own where eai-delphi installs.
"""

# ---- delphi/explainers/default/prompts.py ----

SYSTEM = (
    'You are a meticulous AI researcher conducting an important investigation into patterns '
    'found in language. Your task is to analyze text and provide an explanation that '
    'thoroughly encapsulates possible patterns found in it.\n'
    'Guidelines:\n'
    '\n'
    'You will be given a list of text examples on which special words are selected and between '
    'delimiters like <<this>>. If a sequence of consecutive tokens all are important, the '
    'entire sequence of tokens will be contained between delimiters <<just like this>>. How '
    'important each token is for the behavior is listed after each example in parentheses.\n'
    '\n'
    '- Try to produce a concise final description. Simply describe the text latents that are '
    'common in the examples, and what patterns you found.\n'
    "- If the examples are uninformative, you don't need to mention them. Don't focus on "
    'giving examples of important tokens, but try to summarize the patterns found in the examples.\n'
    '- Do not mention the marker tokens (<< >>) in your explanation.\n'
    '- Do not make lists of possible explanations. Keep your explanations short and concise.\n'
    '- The last line of your response must be the formatted explanation, using [EXPLANATION]:\n'
    '\n'
    '{prompt}\n'
)

EXAMPLE_1 = (
    '\n'
    'Example 1:  and he was <<over the moon>> to find\n'
    "Example 2:  we'll be laughing <<till the cows come home>>! Pro\n"
    "Example 3:  thought Scotland was boring, but really there's more <<than meets the eye>>! I'd\n"
)

EXAMPLE_1_ACTIVATIONS = (
    '\n'
    'Example 1:  and he was <<over the moon>> to find\n'
    'Activations: ("over", 5), (" the", 6), (" moon", 9)\n'
    "Example 2:  we'll be laughing <<till the cows come home>>! Pro\n"
    'Activations: ("till", 5), (" the", 5), (" cows", 8), (" come", 8), (" home", 8)\n'
    "Example 3:  thought Scotland was boring, but really there's more <<than meets the eye>>! I'd\n"
    'Activations: ("than", 5), (" meets", 7), (" the", 6), (" eye", 8)\n'
)

EXAMPLE_1_EXPLANATION = (
    '\n'
    '[EXPLANATION]: Common idioms in text conveying positive sentiment.\n'
)

EXAMPLE_2 = (
    '\n'
    'Example 1:  a river is wide but the ocean is wid<<er>>. The ocean\n'
    'Example 2:  every year you get tall<<er>>," she\n'
    'Example 3:  the hole was small<<er>> but deep<<er>> than the\n'
)

EXAMPLE_2_ACTIVATIONS = (
    '\n'
    'Example 1:  a river is wide but the ocean is wid<<er>>. The ocean\n'
    'Activations: ("er", 8)\n'
    'Example 2:  every year you get tall<<er>>," she\n'
    'Activations: ("er", 2)\n'
    'Example 3:  the hole was small<<er>> but deep<<er>> than the\n'
    'Activations: ("er", 9), ("er", 9)\n'
)

EXAMPLE_2_EXPLANATION = (
    '\n'
    '[EXPLANATION]: The token "er" at the end of a comparative adjective describing size.\n'
)

EXAMPLE_3 = (
    '\n'
    'Example 1:  something happening inside my <<house>>", he\n'
    'Example 2:  presumably was always contained in <<a box>>", according\n'
    'Example 3:  people were coming into the <<smoking area>>".\n'
    '\n'
    'However he\n'
    'Example 4:  Patrick: "why are you getting in the << way?>>" Later,\n'
)

EXAMPLE_3_ACTIVATIONS = (
    '\n'
    'Example 1:  something happening inside my <<house>>", he\n'
    'Activations: ("house", 7)\n'
    'Example 2:  presumably was always contained in <<a box>>", according\n'
    'Activations: ("a", 5), ("box", 9)\n'
    'Example 3:  people were coming into the <<smoking area>>".\n'
    '\n'
    'However he\n'
    'Activations: ("smoking", 2), ("area", 4)\n'
    'Example 4:  Patrick: "why are you getting in the << way?>>" Later,\n'
    'Activations: ("way", 4), ("?", 2)\n'
)

EXAMPLE_3_EXPLANATION = (
    '\n'
    '[EXPLANATION]: Nouns representing a distinct objects that contains something, sometimes '
    'preciding a quotation mark.\n'
)

# ---- delphi/scorers/classifier/prompts/detection_prompt.py ----

DETECTION_SYSTEM_PROMPT = (
    'You are an intelligent and meticulous linguistics researcher.\n'
    '\n'
    'You will be given a certain latent of text, such as "male pronouns" or "text with '
    'negative sentiment".\n'
    '\n'
    'You will then be given several text examples. Your task is to determine which examples '
    'possess the latent.\n'
    '\n'
    'For each example in turn, return 1 if the sentence is correctly labeled or 0 if the '
    'tokens are mislabeled. You must return your response in a valid Python list. Do not '
    'return anything else besides a Python list.\n'
)

DETECTION_EXAMPLE_ONE = (
    'Latent explanation: Words related to American football positions, specifically the tight '
    'end position.\n'
    '\n'
    'Test examples:\n'
    '\n'
    'Example 0:<|endoftext|>Getty ImagesĊĊPatriots tight end Rob Gronkowski had his bossâĢĻ\n'
    'Example 1: names of months used in The Lord of the Rings:ĊĊâĢľâĢ¦the\n'
    'Example 2: Media Day 2015ĊĊLSU defensive end Isaiah Washington (94) speaks to the\n'
    'Example 3: shown, is generally not eligible for ads. For example, videos about recent tragedies,\n'
    'Example 4: line, with the left side âĢĶ namely tackle Byron Bell at tackle and guard Amini\n'
)

DETECTION_RESPONSE_ONE = (
    '[1,0,0,0,1]'
)

DETECTION_EXAMPLE_TWO = (
    'Latent explanation: The word "guys" in the phrase "you guys".\n'
    '\n'
    'Test examples:\n'
    '\n'
    "Example 0: enact an individual health insurance mandate?âĢĿ, Pelosi's response was to "
    'dismiss both\n'
    "Example 1: birth control access<|endoftext|> but I assure you women in Kentucky aren't "
    'laughing as they struggle\n'
    'Example 2: du Soleil Fall Protection Program with construction requirements that do not '
    'apply to theater settings because\n'
    'Example 3:Ċ<|endoftext|> distasteful. Amidst the slime lurk bits of Schadenfre\n'
    'Example 4: the<|endoftext|>ľI want to remind you all that 10 days ago (director Massimil\n'
)

DETECTION_RESPONSE_TWO = (
    '[0,0,0,0,0]'
)

DETECTION_EXAMPLE_THREE = (
    'Latent explanation: "of" before words that start with a capital letter.\n'
    '\n'
    'Test examples:\n'
    '\n'
    'Example 0: climate, TomblinâĢĻs Chief of Staff Charlie Lorensen said.Ċ\n'
    'Example 1: no wonderworking relics, no true Body and Blood of Christ, no true Baptism\n'
    'Example 2:ĊĊDeborah Sathe, Head of Talent Development and Production at Film London,\n'
    'Example 3:ĊĊIt has been devised by Director of Public Prosecutions (DPP)\n'
    'Example 4: and fair investigation not even include the Director of Athletics? Â· Finally, '
    'we believe the\n'
)

DETECTION_RESPONSE_THREE = (
    '[1,1,1,1,1]'
)

DETECTION_GENERATION_PROMPT = (
    'Latent explanation: {explanation}\n'
    '\n'
    'Text examples:\n'
    '\n'
    '{examples}\n'
)

# ---- delphi/scorers/classifier/prompts/fuzz_prompt.py ----

FUZZ_SYSTEM_PROMPT = (
    'You are an intelligent and meticulous linguistics researcher.\n'
    '\n'
    'You will be given a certain latent of text, such as "male pronouns" or "text with '
    'negative sentiment". You will be given a few examples of text that contain this latent. '
    'Portions of the sentence which strongly represent this latent are between tokens << and >>.\n'
    '\n'
    'Some examples might be mislabeled. Your task is to determine if every single token within '
    '<< and >> is correctly labeled. Consider that all provided examples could be correct, '
    'none of the examples could be correct, or a mix. An example is only correct if every '
    'marked token is representative of the latent\n'
    '\n'
    'For each example in turn, return 1 if the sentence is correctly labeled or 0 if the '
    'tokens are mislabeled. You must return your response in a valid Python list. Do not '
    'return anything else besides a Python list.\n'
)

FUZZ_EXAMPLE_ONE = (
    'Latent explanation: Words related to American football positions, specifically the tight '
    'end position.\n'
    '\n'
    'Test examples:\n'
    '\n'
    'Example 0:<|endoftext|>Getty ImagesĊĊPatriots<< tight end>> Rob Gronkowski had his bossâĢĻ\n'
    'Example 1: posted<|endoftext|>You should know this<< about>> offensive line coaches: they '
    'are large, demanding<< men>>\n'
    'Example 2: Media Day 2015ĊĊLSU<< defensive>> end Isaiah Washington (94) speaks<< to the>>\n'
    'Example 3:<< running backs>>," he said. .. Defensive<< end>> Carroll Phillips is '
    'improving and his injury is\n'
    'Example 4:<< line>>, with the left side âĢĶ namely<< tackle>> Byron Bell at<< tackle>> '
    'and<< guard>> Amini\n'
)

FUZZ_RESPONSE_ONE = (
    '[1,0,0,1,1]'
)

FUZZ_EXAMPLE_TWO = (
    'Latent explanation: The word "guys" in the phrase "you guys".\n'
    '\n'
    'Test examples:\n'
    '\n'
    'Example 0: if you are<< comfortable>> with it. You<< guys>> support me in many other ways '
    'already and\n'
    'Example 1: birth control access<|endoftext|> but I assure you<< women>> in Kentucky '
    "aren't laughing as they struggle\n"
    'Example 2:âĢĻs gig! I hope you guys<< LOVE>> her, and<< please>> be nice,\n'
    'Example 3:American, told<< Hannity>> that âĢľyou<< guys>> are playing the race card.âĢĿ\n'
    'Example 4:<< the>><|endoftext|>ľI want to<< remind>> you all that 10 days ago (director Massimil\n'
)

FUZZ_RESPONSE_TWO = (
    '[0,0,0,0,0]'
)

FUZZ_EXAMPLE_THREE = (
    'Latent explanation: "of" before words that start with a capital letter.\n'
    '\n'
    'Test examples:\n'
    '\n'
    'Example 0: climate, TomblinâĢĻs Chief<< of>> Staff Charlie Lorensen said.Ċ\n'
    'Example 1: no wonderworking relics, no true Body and Blood<< of>> Christ, no true Baptism\n'
    'Example 2:ĊĊDeborah Sathe, Head<< of>> Talent Development and Production at Film London,\n'
    'Example 3:ĊĊIt has been devised by Director<< of>> Public Prosecutions (DPP)\n'
    'Example 4: and fair investigation not even include the Director<< of>> Athletics? Â· '
    'Finally, we believe the\n'
)

FUZZ_RESPONSE_THREE = (
    '[1,1,1,1,1]'
)
